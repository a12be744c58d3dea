"""[`FederatedRecommendationTrainer`]: federated training of distributional (or single-embedding) recommendation.

The plain in-process loop: every round samples clients, runs each client's local update from the shared models
(`local_update`), and averages the returned shared parameters weighted by the clients' training items (`aggregate`,
FedAvg). A client's own user embeddings stay in `client_states` (on the client) and are never averaged. Metrics are
HR@k and NDCG@k of the held-out item against its sampled negatives (`evaluate`).
"""

import copy
import math
from collections.abc import Callable

import numpy as np
import torch
from diffusers import DDIMScheduler, DDPMScheduler
from diffusers.utils import logging
from torch.nn import functional as F

from ..data.movielens import LeaveOneOutSplit
from ..models.item_scoring import ItemScoringModel
from ..models.neural_item_scoring import NeuralItemScoringModel
from ..models.user_embedding_denoiser import UserEmbeddingDenoiser
from ..pipelines.distributional_recommendation.pipeline_distributional_recommendation import (
    DistributionalRecommendationPipeline,
)
from ..utils import check_positive_int, public
from .federated_recommendation_config import FederatedRecommendationConfig


logger = logging.get_logger(__name__)


def hit_rate_and_ndcg(scores: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per user, HR@k and NDCG@k of the held-out item, which is column 0 of `scores` `(users, 1 + negatives)` (ties
    and NaN scores counted against it, so a diverged model scores 0, not 1): `(hits (users,), ndcg (users,))`."""
    rank = (~(scores[:, 1:] < scores[:, :1])).sum(1)  # items not scored below the held-out one (NaN included)
    hits = (rank < k).float()
    return hits, hits / torch.log2(rank.float() + 2)


def best_scoring_assignment(scores: torch.Tensor) -> torch.Tensor:
    """Hard-EM assignment of a client's positives to its embeddings: `scores` `(embeddings, positives)` (each
    embedding's score of each positive) to boolean masks of the same shape, each positive on the embedding scoring it
    highest (ties to the lower index). Every embedding keeps at least one positive: one left with none, in index
    order, takes the positive it scores best among those of the currently largest group (moved, or shared when that
    group holds a single positive, i.e. with fewer positives than embeddings). Deterministic."""
    if scores.ndim != 2 or scores.shape[1] == 0:
        raise ValueError(f"`scores` must have shape (embeddings, positives >= 1), got {tuple(scores.shape)}.")
    copies = scores.shape[0]
    masks = F.one_hot(scores.argmax(0), copies).T.bool()  # (embeddings, positives)
    for empty in range(copies):
        if masks[empty].any():
            continue
        sizes = masks.sum(1)
        largest = int(sizes.argmax())
        best = int(scores[empty].masked_fill(~masks[largest], -math.inf).argmax())
        masks[empty, best] = True
        if sizes[largest] > 1:  # move it; a single positive is shared instead, so its group is never emptied
            masks[largest, best] = False
    return masks


@public
class FederatedRecommendationTrainer:
    r"""
    Federated recommendation with one client per user (TRL-shaped: a config and a trainer with separate sampling,
    local-update, aggregation and evaluation methods).

    Args:
        config ([`FederatedRecommendationConfig`]): the options.
        split ([`LeaveOneOutSplit`]): each client's training items and its held-out validation and test items with
            their negatives ([`leave_one_out_split`]).
    """

    def __init__(self, config: FederatedRecommendationConfig, split: LeaveOneOutSplit):
        if not isinstance(split, LeaveOneOutSplit):
            raise TypeError(f"`split` must be a LeaveOneOutSplit, got {type(split).__name__}.")
        self._check_split(split)
        if split.skipped:  # the split's documented skip (fewer than 3 distinct items, ...): said, not silent
            users = sorted(split.skipped)
            logger.warning(
                f"{len(users)} user(s) were skipped by the split and get no client, e.g. user {users[0]}: "
                f"{split.skipped[users[0]]}."
            )
        self.config, self.split = config, split
        torch.manual_seed(config.seed)
        if config.method == "fedncf":
            self.item_model = NeuralItemScoringModel(split.num_items, config.embedding_dim, config.ncf_hidden_size)
        else:
            self.item_model = ItemScoringModel(split.num_items, config.embedding_dim)
        self.denoiser = (
            UserEmbeddingDenoiser(config.embedding_dim, config.denoiser_hidden_size, config.denoiser_layers)
            if config.method == "distributional"
            else None
        )
        self.noise_scheduler = DDPMScheduler(num_train_timesteps=config.num_train_timesteps)
        copies = config.num_user_embeddings if config.method == "distributional" else 1
        generator = torch.Generator().manual_seed(config.seed + 1)
        self.client_states = []
        for items in split.train:
            # each embedding's random half of the client's positives (fixed per client; never empty), used by
            # `embedding_assignment="random_half"`; drawn for either rule so both start from the same embeddings
            masks = torch.rand(copies, len(items), generator=generator) < (0.5 if copies > 1 else 2.0)
            masks[masks.sum(1) == 0, 0] = True
            embeddings = 0.1 * torch.randn(copies, config.embedding_dim, generator=generator)
            state = {"embeddings": embeddings, "masks": masks}
            if config.method == "pfedrec":
                state["bias"] = torch.zeros(1)  # the bias of PFedRec's local score function
            self.client_states.append(state)
        self.history = []

    @staticmethod
    def _check_split(split: LeaveOneOutSplit) -> None:
        """Every client has a training item, every item index lies in `[0, num_items)`, and the validation and test
        candidates have one row per client; a `ValueError` naming the client and the item otherwise."""
        check_positive_int("split.num_items", split.num_items)
        for position, items in enumerate(split.train):
            if len(items) == 0:
                raise ValueError(f"client {position} has no training item; split users with at least 3 interactions.")
            bad = [int(i) for i in np.asarray(items).reshape(-1) if not 0 <= int(i) < split.num_items]
            if bad:
                raise ValueError(
                    f"client {position}'s training items hold item {bad[0]}, outside [0, {split.num_items}) "
                    "(the catalogue)."
                )
        for name in ("validation", "test"):
            rows = np.asarray(getattr(split, name))
            if rows.ndim != 2 or len(rows) != len(split.train):
                raise ValueError(
                    f"`split.{name}` must have shape (clients, 1 + negatives) with {len(split.train)} rows, got "
                    f"{rows.shape}."
                )
            bad = np.argwhere((rows < 0) | (rows >= split.num_items))
            if len(bad):
                client, column = bad[0].tolist()
                raise ValueError(
                    f"`split.{name}` holds item {int(rows[client, column])} for client {client}, outside "
                    f"[0, {split.num_items}) (the catalogue)."
                )

    @property
    def num_clients(self) -> int:
        return len(self.split.train)

    def sample_clients(self, round_index: int) -> list[int]:
        """The clients of round `round_index` (seeded by the config's seed and the round)."""
        rng = np.random.default_rng([self.config.seed, round_index])
        count = min(self.config.clients_per_round, self.num_clients)
        return sorted(rng.choice(self.num_clients, size=count, replace=False).tolist())

    def shared_state(self) -> dict[str, torch.Tensor]:
        """The parameters the server averages: the item side, and the denoiser for `"distributional"`."""
        state = {f"item_model.{k}": v for k, v in self.item_model.state_dict().items()}
        if self.denoiser is not None:
            state.update({f"denoiser.{k}": v for k, v in self.denoiser.state_dict().items()})
        return state

    def load_shared_state(self, state: dict[str, torch.Tensor]) -> None:
        self.item_model.load_state_dict({k[11:]: v for k, v in state.items() if k.startswith("item_model.")})
        if self.denoiser is not None:
            self.denoiser.load_state_dict({k[9:]: v for k, v in state.items() if k.startswith("denoiser.")})

    def _local_sgd(self, client: int, items: ItemScoringModel, generator: torch.Generator) -> tuple[dict, list]:
        """`local_epochs` of SGD on the BCE of the client's positives against sampled negatives, on `items` (a copy
        of the shared item side, updated in place) and the client's own parameters: its embeddings, each on its own
        share of the positives (`masks`, see [`positive_masks`]), and for `"pfedrec"` its score function's bias.
        Returns the updated client parameters with the masks used (the stored state is untouched) and the epochs'
        losses."""
        config, state = self.config, self.client_states[client]
        positives = torch.tensor(self.split.train[client], dtype=torch.long)  # a copy: Ray hands read-only arrays
        masks = self.positive_masks(client, items)  # (copies, positives)
        local = {name: state[name].clone().requires_grad_(True) for name in ("embeddings", "bias") if name in state}
        users = local["embeddings"]  # (copies, d)
        optimizer = torch.optim.SGD([*local.values(), *items.parameters()], lr=config.learning_rate)
        losses = []
        for _ in range(config.local_epochs):
            negatives = torch.randint(
                0, self.split.num_items, (len(positives) * config.negatives_per_positive,), generator=generator
            )
            candidates = torch.cat([positives, negatives])
            labels = torch.cat([torch.ones(len(positives)), torch.zeros(len(negatives))])
            weights = torch.cat(
                [masks.float(), torch.ones(len(users), len(negatives))], dim=1
            )  # each embedding on its own share of the positives and every negative
            logits = items.scores(users, candidates[None].expand(len(users), -1))  # (copies, candidates)
            if "bias" in local:
                logits = logits + local["bias"]
            loss = (
                F.binary_cross_entropy_with_logits(logits, labels.expand_as(logits), weight=weights, reduction="sum")
                / weights.sum()
            )
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
        return {**{name: value.detach() for name, value in local.items()}, "masks": masks}, losses

    @torch.no_grad()
    def positive_masks(self, client: int, items: ItemScoringModel) -> torch.Tensor:
        """`(copies, positives)` booleans: which of the client's positives fit each of its embeddings in this local
        update. One embedding (the single-embedding methods): all of them. `embedding_assignment="random_half"`: the
        client's fixed random halves; `"best_scoring"`: [`best_scoring_assignment`] of the embeddings' scores under
        `items` (the shared item side the client received), recomputed at every local update."""
        state = self.client_states[client]
        if len(state["embeddings"]) == 1 or self.config.embedding_assignment == "random_half":
            return state["masks"]
        positives = torch.tensor(self.split.train[client], dtype=torch.long)
        users = state["embeddings"]
        return best_scoring_assignment(items.scores(users, positives[None].expand(len(users), -1)))

    def local_update(self, client: int, round_index: int) -> tuple[dict[str, torch.Tensor], int, float]:
        """One client's round: from copies of the shared models, `local_epochs` of SGD on the BCE of its positives
        against sampled negatives (its own parameters and the item side), then for `"distributional"` one denoiser
        step on its embeddings. Returns `(shared state, number of training items, mean loss)`; the client's own
        parameters stay in `client_states`."""
        config, state = self.config, self.client_states[client]
        positives = torch.tensor(self.split.train[client], dtype=torch.long)  # a copy: Ray hands read-only arrays
        generator = torch.Generator().manual_seed(config.seed * 1_000_003 + round_index * 10_007 + client)
        items = copy.deepcopy(self.item_model)
        local, losses = self._local_sgd(client, items, generator)
        state.update(local)
        shared = {f"item_model.{k}": v for k, v in items.state_dict().items()}
        if self.denoiser is not None:
            denoiser = copy.deepcopy(self.denoiser)
            optimizer = torch.optim.Adam(denoiser.parameters(), lr=config.denoiser_learning_rate)
            with torch.no_grad():
                summary = items.summary([positives]).expand(len(state["embeddings"]), -1)
            targets = state["embeddings"]
            noise = torch.randn(targets.shape, generator=generator)
            timesteps = torch.randint(0, config.num_train_timesteps, (len(targets),), generator=generator)
            noisy = self.noise_scheduler.add_noise(targets, noise, timesteps)
            loss = F.mse_loss(denoiser(noisy, timesteps, summary).sample, noise)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            shared.update({f"denoiser.{k}": v for k, v in denoiser.state_dict().items()})
        return shared, len(positives), float(np.mean(losses))

    @staticmethod
    def aggregate(updates: list[tuple[dict[str, torch.Tensor], int]]) -> dict[str, torch.Tensor]:
        """FedAvg: the average of the clients' shared states weighted by their numbers of training items."""
        total = sum(count for _, count in updates)
        keys = updates[0][0].keys()
        return {
            key: sum(state[key].float() * (count / total) for state, count in updates).to(updates[0][0][key].dtype)
            for key in keys
        }

    def run_local_updates(
        self, clients: list[int], round_index: int
    ) -> list[tuple[dict[str, torch.Tensor], int, float]]:
        """The in-process engine: each client's `local_update`, in the order of `clients`."""
        return [self.local_update(client, round_index) for client in clients]

    def train_round(self, round_index: int, run_local_updates: Callable | None = None) -> dict:
        """One round: sample clients, run their local updates, FedAvg what they return into the shared models.

        `run_local_updates(clients, round_index)` returns each client's `(shared state, training items, loss)` in the
        order of `clients`; it defaults to [`run_local_updates`] (every client in this process). A federated engine
        passes its own (the Flower server sends each client the shared state and gathers the replies), so sampling,
        averaging and the history are this one method whatever runs the clients.
        """
        if self.config.centralised:
            if run_local_updates is not None:
                raise ValueError("`centralised=True` trains on pooled data in this process; it takes no engine.")
            return self._centralised_round(round_index)
        clients = self.sample_clients(round_index)
        results = (run_local_updates or self.run_local_updates)(clients, round_index)
        if len(results) != len(clients):
            raise RuntimeError(f"round {round_index}: {len(results)} local updates for {len(clients)} clients.")
        losses = [loss for _, _, loss in results]
        self.load_shared_state(self.aggregate([(shared, count) for shared, count, _ in results]))
        record = {"round": round_index + 1, "loss": float(np.mean(losses))}
        self.history.append(record)
        return record

    def _centralised_round(self, round_index: int) -> dict:
        """The upper reference's epoch: every user in a seeded order, each local update starting from the models the
        previous one left (sequential SGD on the pooled data, nothing averaged)."""
        order = np.random.default_rng([self.config.seed, round_index]).permutation(self.num_clients)
        losses = []
        for client in order.tolist():
            shared, _, loss = self.local_update(client, round_index)
            self.load_shared_state(shared)
            losses.append(loss)
        record = {"round": round_index + 1, "loss": float(np.mean(losses))}
        self.history.append(record)
        return record

    def train(self, num_rounds: int | None = None, run_local_updates: Callable | None = None) -> list[dict]:
        """Run `num_rounds` (default the config's) rounds from where the history ends (`run_local_updates`: see
        [`train_round`])."""
        start = len(self.history)
        for round_index in range(start, start + (num_rounds or self.config.num_rounds)):
            self.train_round(round_index, run_local_updates)
        return self.history

    def pipeline(self) -> DistributionalRecommendationPipeline:
        """The recommendation pipeline of the shared models (for `"distributional"`)."""
        if self.denoiser is None:
            raise ValueError(
                f"`method={self.config.method!r}` has no denoiser; its clients score with their own embedding."
            )
        scheduler = DDIMScheduler.from_config(self.noise_scheduler.config)
        pipe = DistributionalRecommendationPipeline(self.denoiser.eval(), self.item_model.eval(), scheduler)
        pipe.set_progress_bar_config(disable=True)
        return pipe

    @torch.no_grad()
    def candidate_scores(self, split_name: str = "validation", seed: int = 0) -> torch.Tensor:
        """`(clients, 1 + negatives)` scores of each client's held-out item (column 0) and its negatives."""
        candidates = torch.as_tensor(getattr(self.split, split_name), dtype=torch.long)
        if self.config.method == "pfedrec":
            return self._personalised_scores(candidates, seed)
        if self.denoiser is None:
            users = torch.stack([state["embeddings"][0] for state in self.client_states])
            return torch.sigmoid(self.item_model.scores(users, candidates))
        pipe = self.pipeline()
        return pipe(
            [torch.as_tensor(items) for items in self.split.train],
            num_samples=self.config.num_samples,
            top_k=1,
            num_inference_steps=self.config.num_inference_steps,
            generator=torch.Generator().manual_seed(seed),
            candidates=candidates,
        ).scores

    @torch.no_grad()
    def catalogue_scores(self, seed: int = 0, batch_size: int = 64) -> torch.Tensor:
        """`(clients, num_items)` scores of every item for every client, as [`candidate_scores`] scores the held-out
        candidates (the same models, draws and personalisation; interacted items are not excluded): what ranks a
        client's recommendations. `batch_size` clients at a time bounds FedNCF's `(clients, items, hidden)` memory."""
        check_positive_int("batch_size", batch_size)
        if self.config.method == "pfedrec":
            catalogue = torch.arange(self.split.num_items).expand(self.num_clients, -1)
            return self._personalised_scores(catalogue, seed)
        if self.denoiser is None:
            users = torch.stack([state["embeddings"][0] for state in self.client_states])
            return torch.cat([torch.sigmoid(self.item_model.scores(chunk)) for chunk in users.split(batch_size)])
        return self.pipeline()(
            [torch.as_tensor(items) for items in self.split.train],
            num_samples=self.config.num_samples,
            top_k=1,
            num_inference_steps=self.config.num_inference_steps,
            generator=torch.Generator().manual_seed(seed),
            exclude_interacted=False,
        ).scores

    @torch.enable_grad()
    def _personalised_scores(self, candidates: torch.Tensor, seed: int) -> torch.Tensor:
        """PFedRec's dual personalisation: each client scores with its own score function and its own copy of the
        item embeddings, fine-tuned from the shared ones by one local update on its training items (nothing stored)."""
        rows = []
        for client in range(self.num_clients):
            items = copy.deepcopy(self.item_model)
            generator = torch.Generator().manual_seed(seed * 1_000_003 + client)
            local, _ = self._local_sgd(client, items, generator)
            with torch.no_grad():
                logits = items.scores(local["embeddings"][0], candidates[client]) + local["bias"]
            rows.append(torch.sigmoid(logits))
        return torch.stack(rows)

    def evaluate(self, split_name: str = "validation", seed: int = 0) -> dict:
        """HR@k and NDCG@k over every client, with their standard errors."""
        if split_name not in ("validation", "test"):
            raise ValueError(f"`split_name` must be 'validation' or 'test', got {split_name!r}.")
        hits, ndcg = hit_rate_and_ndcg(self.candidate_scores(split_name, seed), self.config.top_k)
        n = len(hits)
        k = self.config.top_k
        return {
            f"hr@{k}": float(hits.mean()),
            f"hr@{k}_se": float(hits.std() / math.sqrt(n)),
            f"ndcg@{k}": float(ndcg.mean()),
            f"ndcg@{k}_se": float(ndcg.std() / math.sqrt(n)),
        }
