"""Flower as the federated engine: the simulation runs the trainer's rounds and ends with the in-process loop's shared
models, and so does `flwr run` against separate Flower processes. Needs `flwr[simulation]` (the `flower` extra, tested in its own environment by CI); skipped without it."""

import json
import os
import socket
import subprocess
import sys
import time

import pytest
import torch


flwr = pytest.importorskip("flwr")
pytest.importorskip("ray")

from diffusers_ext import (  # noqa: E402
    DistributionalRecommendationPipeline,
    FederatedRecommendationConfig,
    FederatedRecommendationTrainer,
)
from diffusers_ext.data.movielens import MultiTasteWorld, leave_one_out_split  # noqa: E402
from diffusers_ext.trainers.federated_recommendation_flower import (  # noqa: E402
    config_from_run_config,
    run_flower_simulation,
    split_from_run_config,
)


REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def tiny_split():
    world = MultiTasteWorld(num_users=8, num_items=250, rank=4, interactions_per_user=12, seed=1)
    return leave_one_out_split(world.interactions, num_negatives=99, seed=1)


@pytest.mark.parametrize("method", ["distributional", "fedmf"])
def test_the_flower_simulation_gives_the_in_process_shared_models(method):
    split = tiny_split()
    config = FederatedRecommendationConfig(
        method=method, embedding_dim=4, num_rounds=3, clients_per_round=4, denoiser_hidden_size=8,
        num_train_timesteps=10, seed=5,
    )  # fmt: skip
    flower = run_flower_simulation(config, split)
    local = FederatedRecommendationTrainer(config, split)
    local.train()
    assert [r["round"] for r in flower.history] == [1, 2, 3]
    assert flower.history == local.history  # the same clients' losses, round by round
    expected = local.shared_state()
    assert flower.shared_state.keys() == expected.keys()
    for key, value in expected.items():
        torch.testing.assert_close(flower.shared_state[key], value, rtol=0, atol=0)
    # the models moved: equal because the same rounds ran, not because nothing did
    untrained = FederatedRecommendationTrainer(config, split).shared_state()
    assert not torch.equal(
        untrained["item_model.item_embeddings.weight"], expected["item_model.item_embeddings.weight"]
    )


def test_run_config_builds_the_config_and_split_and_names_bad_keys():
    run_config = {"dataset": "multi-taste", "world-users": 8, "world-items": 250, "world-rank": 4,
                  "world-interactions": 12, "world-seed": 1, "split-seed": 1, "method": "fedmf", "num-rounds": 2}  # fmt: skip
    config = config_from_run_config(run_config)
    assert config.method == "fedmf" and config.num_rounds == 2
    split = split_from_run_config(run_config)
    assert [list(t) for t in split.train] == [list(t) for t in tiny_split().train]
    with pytest.raises(ValueError, match=r"unknown key\(s\) \['num-round'\]"):
        config_from_run_config({"num-round": 3})
    with pytest.raises(ValueError, match="`dataset` must be 'ml-100k' or 'multi-taste', got 'ml-1m'"):
        split_from_run_config({"dataset": "ml-1m"})


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_port(port: int, process: subprocess.Popen, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert process.poll() is None, "the SuperLink exited while starting"
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)
    raise TimeoutError(f"nothing listens on port {port} after {timeout} s")


@pytest.mark.slow
def test_separate_flower_processes_give_the_in_process_shared_models(tmp_path):
    """`flwr run` of the committed Flower app against a SuperLink and one SuperNode per user, each its own process
    (the ServerApp and the ClientApps run in processes Flower starts): the saved pipeline holds the in-process
    loop's shared models."""
    bin_dir = os.path.dirname(sys.executable)
    if not all(
        os.path.exists(os.path.join(bin_dir, tool)) for tool in ("flower-superlink", "flower-supernode", "flwr")
    ):
        pytest.skip("Flower's command-line tools are not installed beside this Python")
    port = free_port()
    home = tmp_path / "flwr-home"
    home.mkdir()
    (home / "config.toml").write_text(
        f'[superlink]\ndefault = "test"\n\n[superlink.test]\naddress = "127.0.0.1:{port}"\ninsecure = true\n'
    )
    # Flower's processes run with this process's torch thread count: a CPU reduction's result depends on how many
    # threads split it, so bitwise equality needs the same count on both sides (unset, a child may choose another).
    threads = str(torch.get_num_threads())
    env = {
        **os.environ, "FLWR_HOME": str(home), "PATH": bin_dir + os.pathsep + os.environ["PATH"], "PYTHONPATH": REPO,
        "OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads,
    }  # fmt: skip
    run_config = {
        "dataset": "multi-taste", "world-users": 8, "world-items": 250, "world-rank": 4, "world-interactions": 12,
        "world-seed": 1, "split-seed": 1, "method": "distributional", "embedding-dim": 4, "num-rounds": 3,
        "clients-per-round": 4, "denoiser-hidden-size": 8, "num-train-timesteps": 10, "seed": 5,
        "output-dir": str(tmp_path / "out"),
    }  # fmt: skip
    overrides = " ".join(f"{k}={json.dumps(v)}" for k, v in run_config.items())
    processes = []

    def start(*command, log):
        processes.append(
            subprocess.Popen(
                command, env=env, cwd=tmp_path, stdout=open(tmp_path / log, "w"), stderr=subprocess.STDOUT
            )
        )
        return processes[-1]

    try:
        link = start("flower-superlink", "--insecure", "--port", str(port), log="superlink.log")
        wait_for_port(port, link)
        for user in range(8):
            start("flower-supernode", "--insecure", "--superlink", f"127.0.0.1:{port}", "--port", str(free_port()),
                  "--node-config", f"partition-id={user} num-partitions=8", log=f"supernode-{user}.log")  # fmt: skip
        run = subprocess.run(
            ["flwr", "run", os.path.join(REPO, "training", "flower_federated_recommendation"), "test",
             "--run-config", overrides, "--stream"],
            env=env, cwd=tmp_path, capture_output=True, text=True, timeout=400,
        )  # fmt: skip
        assert run.returncode == 0, run.stdout + run.stderr
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            process.wait(timeout=30)
    assert (tmp_path / "out" / "model_index.json").exists(), (tmp_path / "superlink.log").read_text()[-3000:]
    saved = DistributionalRecommendationPipeline.from_pretrained(tmp_path / "out")
    local = FederatedRecommendationTrainer(config_from_run_config(run_config), split_from_run_config(run_config))
    local.train()
    for name in ("item_model", "denoiser"):
        expected = getattr(local, name).state_dict()
        for key, value in getattr(saved, name).state_dict().items():
            torch.testing.assert_close(value, expected[key], rtol=0, atol=0)


def test_a_supernode_without_a_valid_partition_id_is_named():
    from flwr.app import Context, RecordDict

    from diffusers_ext.trainers.federated_recommendation_flower import _node_client

    def context(node_config):
        return Context(run_id=1, node_id=7, node_config=node_config, state=RecordDict(), run_config={})

    assert _node_client(context({"partition-id": 3}), num_clients=8) == 3
    with pytest.raises(ValueError, match=r"`partition-id` must be a user index in \[0, 8\), got 8"):
        _node_client(context({"partition-id": 8}), num_clients=8)
    with pytest.raises(ValueError, match="the SuperNode 7 has no `partition-id`"):
        _node_client(context({}), num_clients=8)
