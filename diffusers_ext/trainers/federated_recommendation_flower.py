"""Flower (`flwr`) as the federated engine of [`FederatedRecommendationTrainer`].

A `ServerApp`/`ClientApp` pair that runs the trainer's rounds over Flower messages: the server keeps the trainer's
shared models, samples each round's clients and averages their replies with the trainer's own `train_round`
(`aggregate`, FedAvg); each client (one Flower SuperNode per user, its user index the node's `partition-id`) runs the
trainer's `local_update` on the shared state it receives, and keeps its own user embeddings in its node's
`context.state` between rounds (they never travel). No round logic is written twice: this module only moves states
between the two sides, so a Flower run gives the in-process loop's shared models for the same config and split.

- [`run_flower_simulation`]: the pair in Flower's simulation runtime (`flwr.simulation.run_simulation`, Ray backend)
  on one machine; returns the final shared state and the history.
- [`flower_server_app`] / [`flower_client_app`]: the pair for a given config and split (what the simulation runs).
- `server_app` / `client_app`: the same pair built from Flower's run config (the `[tool.flwr.app.config]` of an app's
  pyproject.toml, see [`config_from_run_config`] and [`split_from_run_config`]), for `flwr run` against a SuperLink
  and SuperNodes started as separate processes (`flower-superlink`, `flower-supernode --node-config
  "partition-id=<user> num-partitions=<users>"`). The server saves the shared models to the config's `output_dir`.

`flwr` is an optional dependency (`pip install "diffusers-ext[flower]"`): it is imported when this module is.
"""

import dataclasses
import time
from collections.abc import Mapping
from dataclasses import dataclass

from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp

from ..data.movielens import LeaveOneOutSplit, MultiTasteWorld, leave_one_out_split, load_movielens_100k
from .federated_recommendation_config import FederatedRecommendationConfig
from .federated_recommendation_trainer import FederatedRecommendationTrainer


# message types and record names of the exchange
QUERY, TRAIN = "query", "train"
SHARED, USER, METRICS, ROUND = "shared", "user", "metrics", "round"
# run-config keys that choose the data rather than the trainer config
DATA_KEYS = {
    "dataset": "ml-100k",
    "num-negatives": 99,
    "split-seed": 0,
    "world-users": 200,
    "world-items": 500,
    "world-rank": 8,
    "world-interactions": 40,
    "world-seed": 0,
}


@dataclass
class FlowerRunResult:
    """What the server holds after a Flower run: `shared_state` (the averaged item side, and the denoiser for
    `"distributional"`: what [`FederatedRecommendationTrainer.load_shared_state`] takes) and `history` (one record
    per round: `round`, `loss`)."""

    shared_state: dict
    history: list


class _Federation:
    """The config and split both apps run on, and a trainer built from them once per process (a Ray worker serves
    many nodes in turn; each call loads the node's own state into it, so sharing it across nodes is safe)."""

    def __init__(self, config: FederatedRecommendationConfig, split: LeaveOneOutSplit):
        if not isinstance(config, FederatedRecommendationConfig):
            raise TypeError(f"`config` must be a FederatedRecommendationConfig, got {type(config).__name__}.")
        self.config, self.split = config, split
        self._trainer = None

    @property
    def trainer(self) -> FederatedRecommendationTrainer:
        if self._trainer is None:
            self._trainer = FederatedRecommendationTrainer(self.config, self.split)
        return self._trainer

    def __getstate__(self):  # the trainer is rebuilt where the apps are unpickled
        return {"config": self.config, "split": self.split, "_trainer": None}


def _node_client(context: Context, num_clients: int) -> int:
    """The user this SuperNode serves: its `partition-id`, checked against the number of clients."""
    if "partition-id" not in context.node_config:
        raise ValueError(
            f"the SuperNode {context.node_id} has no `partition-id` in its node config {dict(context.node_config)}; "
            "start it with --node-config 'partition-id=<user index> num-partitions=<users>'."
        )
    client = context.node_config["partition-id"]
    if isinstance(client, bool) or not isinstance(client, int) or not 0 <= client < num_clients:
        raise ValueError(f"`partition-id` must be a user index in [0, {num_clients}), got {client!r}.")
    return client


def _client_query(federation: _Federation, message: Message, context: Context) -> Message:
    client = _node_client(context, federation.trainer.num_clients)
    return Message(RecordDict({METRICS: MetricRecord({"client": client})}), reply_to=message)


def _client_train(federation: _Federation, message: Message, context: Context) -> Message:
    trainer = federation.trainer
    client = _node_client(context, trainer.num_clients)
    if USER in context.state:  # this node's embeddings from its previous rounds (first round: the trainer's init)
        trainer.client_states[client] = dict(context.state[USER].to_torch_state_dict())
    trainer.load_shared_state(message.content[SHARED].to_torch_state_dict())
    shared, count, loss = trainer.local_update(client, int(message.content[ROUND]["round"]))
    context.state[USER] = ArrayRecord(dict(trainer.client_states[client]))  # stays on the node
    metrics = MetricRecord({"client": client, "num-examples": count, "loss": loss})
    return Message(RecordDict({SHARED: ArrayRecord(shared), METRICS: metrics}), reply_to=message)


def _client_nodes(grid: Grid, num_clients: int, timeout: float) -> dict[int, int]:
    """`{client: node id}`: waits for `num_clients` SuperNodes, then asks each which user it serves."""
    deadline = time.monotonic() + timeout
    while len(nodes := sorted(grid.get_node_ids())) < num_clients:
        if time.monotonic() > deadline:
            raise RuntimeError(f"{len(nodes)} SuperNodes connected within {timeout} s; {num_clients} are needed.")
        time.sleep(0.2)
    node_of = {}
    for reply in grid.send_and_receive([Message(RecordDict(), dst_node_id=n, message_type=QUERY) for n in nodes]):
        if reply.has_error():
            raise RuntimeError(f"SuperNode {reply.metadata.src_node_id} failed the query: {reply.error.reason}")
        client = int(reply.content[METRICS]["client"])
        if client in node_of:
            raise RuntimeError(
                f"SuperNodes {node_of[client]} and {reply.metadata.src_node_id} both serve user {client}."
            )
        node_of[client] = reply.metadata.src_node_id
    missing = sorted(set(range(num_clients)) - set(node_of))
    if missing:
        raise RuntimeError(f"no SuperNode serves the user(s) {missing[:10]} (of {len(missing)} missing).")
    return node_of


def _server_main(
    federation: _Federation, grid: Grid, result: dict | None, output_dir: str | None, timeout: float
) -> FederatedRecommendationTrainer:
    trainer = federation.trainer
    node_of = _client_nodes(grid, trainer.num_clients, timeout)

    def run_local_updates(clients: list[int], round_index: int) -> list:
        shared = ArrayRecord(trainer.shared_state())
        messages = [
            Message(
                RecordDict({SHARED: shared, ROUND: ConfigRecord({"round": round_index})}),
                dst_node_id=node_of[client],
                message_type=TRAIN,
                group_id=str(round_index),
            )
            for client in clients
        ]
        by_client = {}
        for reply in grid.send_and_receive(messages):
            if reply.has_error():
                raise RuntimeError(
                    f"round {round_index}: SuperNode {reply.metadata.src_node_id} failed: {reply.error.reason}"
                )
            metrics = reply.content[METRICS]
            by_client[int(metrics["client"])] = (
                reply.content[SHARED].to_torch_state_dict(),
                int(metrics["num-examples"]),
                float(metrics["loss"]),
            )
        if sorted(by_client) != sorted(clients):
            raise RuntimeError(f"round {round_index}: replies from {sorted(by_client)}, expected {clients}.")
        return [by_client[client] for client in clients]  # the in-process order, so FedAvg sums alike

    trainer.train(run_local_updates=run_local_updates)
    if result is not None:
        result["shared_state"] = {k: v.clone() for k, v in trainer.shared_state().items()}
        result["history"] = list(trainer.history)
    if output_dir is not None:
        (trainer.pipeline() if trainer.denoiser is not None else trainer.item_model).save_pretrained(output_dir)
    return trainer


def flower_client_app(config: FederatedRecommendationConfig, split: LeaveOneOutSplit) -> ClientApp:
    """The `ClientApp` of `config` and `split`: answers the server's query with its user (the node's
    `partition-id`) and runs the trainer's `local_update` on each `train` message."""
    federation = _Federation(config, split)
    app = ClientApp()

    @app.query()
    def query(message: Message, context: Context) -> Message:
        return _client_query(federation, message, context)

    @app.train()
    def train(message: Message, context: Context) -> Message:
        return _client_train(federation, message, context)

    return app


def flower_server_app(
    config: FederatedRecommendationConfig,
    split: LeaveOneOutSplit,
    result: dict | None = None,
    output_dir: str | None = None,
    timeout: float = 120.0,
) -> ServerApp:
    """The `ServerApp` of `config` and `split`: waits (up to `timeout` seconds) for one SuperNode per user, runs
    `config.num_rounds` rounds through the trainer's `train`, then fills `result` (`shared_state`, `history`) if
    given and saves the shared models to `output_dir` if given."""
    federation = _Federation(config, split)
    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        _server_main(federation, grid, result, output_dir, timeout)

    return app


def run_flower_simulation(
    config: FederatedRecommendationConfig,
    split: LeaveOneOutSplit,
    backend_config: dict | None = None,
    timeout: float = 120.0,
) -> FlowerRunResult:
    """Run the federation in Flower's simulation runtime on this machine: one virtual SuperNode per user of `split`,
    `config.num_rounds` rounds. `backend_config` is Flower's (defaults to one CPU per client and one Ray CPU)."""
    from flwr.simulation import run_simulation

    result = {}
    run_simulation(
        server_app=flower_server_app(config, split, result=result, timeout=timeout),
        client_app=flower_client_app(config, split),
        num_supernodes=len(split.train),
        backend_config=backend_config
        or {"client_resources": {"num_cpus": 1}, "init_args": {"num_cpus": 1, "include_dashboard": False}},
    )
    if "shared_state" not in result:
        raise RuntimeError("the Flower simulation ended without a result; its log above says why.")
    return FlowerRunResult(result["shared_state"], result["history"])


def config_from_run_config(run_config: Mapping) -> FederatedRecommendationConfig:
    """A [`FederatedRecommendationConfig`] from Flower's run config: each field by its name with dashes
    (`num-rounds`, `clients-per-round`, ...); the data keys (`dataset`, ...) are read by [`split_from_run_config`];
    any other key is a `ValueError`."""
    fields = {f.name.replace("_", "-"): f for f in dataclasses.fields(FederatedRecommendationConfig)}
    unknown = sorted(set(run_config) - set(fields) - set(DATA_KEYS))
    if unknown:
        raise ValueError(
            f"the run config has unknown key(s) {unknown}; expected {sorted(fields)} or {sorted(DATA_KEYS)}."
        )
    return FederatedRecommendationConfig(**{fields[k].name: v for k, v in run_config.items() if k in fields})


def split_from_run_config(run_config: Mapping) -> LeaveOneOutSplit:
    """The split named by the run config: `dataset = "ml-100k"` (the `recbole` wheel's MovieLens-100K) or
    `"multi-taste"` ([`MultiTasteWorld`] with `world-*` sizes), leave-one-out with `num-negatives` negatives drawn
    with `split-seed`. Every process building it from the same run config gets the same split."""
    get = {key: run_config.get(key, default) for key, default in DATA_KEYS.items()}
    if get["dataset"] == "ml-100k":
        interactions = load_movielens_100k()
    elif get["dataset"] == "multi-taste":
        interactions = MultiTasteWorld(
            num_users=get["world-users"],
            num_items=get["world-items"],
            rank=get["world-rank"],
            interactions_per_user=get["world-interactions"],
            seed=get["world-seed"],
        ).interactions
    else:
        raise ValueError(f"`dataset` must be 'ml-100k' or 'multi-taste', got {get['dataset']!r}.")
    return leave_one_out_split(interactions, num_negatives=get["num-negatives"], seed=get["split-seed"])


_FEDERATIONS: dict = {}


def _federation_of(context: Context) -> _Federation:
    """The federation of a run config, built once per process."""
    key = tuple(sorted(context.run_config.items()))
    if key not in _FEDERATIONS:
        _FEDERATIONS[key] = _Federation(
            config_from_run_config(context.run_config), split_from_run_config(context.run_config)
        )
    return _FEDERATIONS[key]


# The pair `flwr run` loads (`serverapp = "diffusers_ext.trainers.federated_recommendation_flower:server_app"`).
client_app = ClientApp()
server_app = ServerApp()


@client_app.query()
def _run_config_query(message: Message, context: Context) -> Message:
    return _client_query(_federation_of(context), message, context)


@client_app.train()
def _run_config_train(message: Message, context: Context) -> Message:
    return _client_train(_federation_of(context), message, context)


@server_app.main()
def _run_config_server(grid: Grid, context: Context) -> None:
    federation = _federation_of(context)
    _server_main(federation, grid, None, federation.config.output_dir, timeout=600.0)
