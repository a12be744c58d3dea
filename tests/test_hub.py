"""`--push_to_hub` against a local stand-in of the Hub's upload API (the pattern of `huggingface_hub`'s own tests:
`HfApi.whoami`, `HfApi.create_repo` and `HfApi.upload_folder` replaced, nothing leaves the machine): the start-up
check refuses an upload that cannot happen before any training, and a script uploads its folder, model card
included, checkpoints and logs left out."""

import fnmatch
import importlib.util
import os
from types import SimpleNamespace

import pytest
from huggingface_hub import HfApi
from huggingface_hub.errors import HfHubHTTPError
from script_launch import as_command_line

from diffusers_ext.training_utils import HUB_IGNORE_PATTERNS, check_hub_arguments, push_to_hub


REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GRAPH_FLOW = os.path.join(REPO, "training", "train_graph_flow.py")
TINY_GRAPH_FLOW = [
    "--dataset_name", "planar", "--num_nodes", "8", "--node_dim", "16", "--edge_dim", "8", "--num_layers", "1",
    "--num_heads", "2", "--num_random_walk_steps", "3", "--train_batch_size", "8", "--checkpointing_steps", "1",
    "--report_to", "none", "--num_eval_graphs", "2", "--eval_inference_steps", "2", "--max_train_steps", "2",
]  # fmt: skip


class StandInHub:
    """Records what a run asks of the Hub; `whoami` answers as `identity`, or raises `error`."""

    def __init__(self, identity=None, error=None):
        self.identity = (
            identity if identity is not None else {"name": "me", "auth": {"accessToken": {"role": "write"}}}
        )
        self.error = error
        self.calls = []
        self.uploaded_files = None

    def install(self, monkeypatch):
        hub = self

        def whoami(api, token=None, *, cache=False):
            hub.calls.append(("whoami", api.token))
            if hub.error is not None:
                raise hub.error
            return hub.identity

        def create_repo(api, repo_id, *, token=None, exist_ok=False, **kwargs):
            hub.calls.append(("create_repo", repo_id, exist_ok))
            name = repo_id if "/" in repo_id else f"{hub.identity['name']}/{repo_id}"
            return SimpleNamespace(repo_id=name)

        def upload_folder(api, *, repo_id, folder_path, ignore_patterns=None, **kwargs):
            hub.calls.append(("upload_folder", repo_id, str(folder_path), list(ignore_patterns or [])))
            files = []
            for root, _, names in os.walk(folder_path):
                files += [os.path.relpath(os.path.join(root, name), folder_path) for name in names]
            hub.uploaded_files = sorted(
                f for f in files if not any(fnmatch.fnmatch(f, pattern) for pattern in ignore_patterns or [])
            )
            return SimpleNamespace(commit_url=f"https://huggingface.co/{repo_id}/commit/0")

        monkeypatch.setattr(HfApi, "whoami", whoami)
        monkeypatch.setattr(HfApi, "create_repo", create_repo)
        monkeypatch.setattr(HfApi, "upload_folder", upload_folder)
        return self


@pytest.fixture
def online(monkeypatch):
    """The Hub "reachable": HF_HUB_OFFLINE unset for the test (the stand-in answers instead of the network)."""
    import huggingface_hub.constants

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)


def _args(tmp_path, **overrides):
    values = {"push_to_hub": True, "hub_model_id": None, "hub_token": "hf_test", "output_dir": str(tmp_path / "out")}
    return SimpleNamespace(**{**values, **overrides})


def _http_error(status: int) -> HfHubHTTPError:
    return HfHubHTTPError(f"{status}", response=SimpleNamespace(status_code=status, headers={}, request=None))


def test_check_hub_arguments_refuses_an_upload_that_cannot_happen(tmp_path, monkeypatch, online):
    import huggingface_hub

    assert check_hub_arguments(_args(tmp_path, push_to_hub=False)) is None  # nothing asked of the Hub
    hub = StandInHub().install(monkeypatch)
    assert check_hub_arguments(_args(tmp_path)) == "me/out"  # the folder's name, in the token's namespace
    assert check_hub_arguments(_args(tmp_path, hub_model_id="org/model")) == "org/model"
    cases = [
        ({"hub_model_id": "not a repo id"}, None, "--hub_model_id 'not a repo id' is not a Hub repository id"),
        ({"hub_model_id": "a/b/c"}, None, "--hub_model_id 'a/b/c' is not a Hub repository id"),
        ({}, _http_error(401), "the Hub refuses --hub_token (401 Unauthorized); pass a valid --hub_token"),
        ({}, ConnectionError("[Errno 101] Network is unreachable"), "the Hub cannot be reached (ConnectionError"),
    ]
    for overrides, error, message in cases:
        hub.error = error
        with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
            check_hub_arguments(_args(tmp_path, **overrides))
    hub.error, hub.identity = None, {"name": "me", "auth": {"accessToken": {"role": "read"}}}
    with pytest.raises(ValueError, match="--hub_token is read-only"):
        check_hub_arguments(_args(tmp_path))
    monkeypatch.setattr(huggingface_hub, "get_token", lambda: None)
    with pytest.raises(ValueError, match="--push_to_hub needs a Hub token .* --hub_token or .*hf auth login"):
        check_hub_arguments(_args(tmp_path, hub_token=None))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    calls = len(hub.calls)
    with pytest.raises(ValueError, match="HF_HUB_OFFLINE is set, so the upload to the Hub cannot happen"):
        check_hub_arguments(_args(tmp_path))
    assert len(hub.calls) == calls  # offline: the Hub is not even asked


def test_push_to_hub_failure_after_training_says_where_the_result_is(tmp_path, monkeypatch, online):
    hub = StandInHub().install(monkeypatch)

    def unreachable(api, repo_id, **kwargs):
        raise ConnectionError("Network is unreachable")

    monkeypatch.setattr(HfApi, "create_repo", unreachable)
    (tmp_path / "out").mkdir()
    with pytest.raises(ValueError, match=r"the upload of .*out' failed \(ConnectionError.* the result is saved there"):
        push_to_hub(str(tmp_path / "out"), "me/out", "hf_test")
    assert not [call for call in hub.calls if call[0] == "upload_folder"]


def _graph_flow():
    spec = importlib.util.spec_from_file_location("train_graph_flow", GRAPH_FLOW)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_script_uploads_its_folder_with_the_card_and_without_checkpoints(tmp_path, monkeypatch, online):
    # train_graph_flow.py trained and uploaded nothing with --push_to_hub; it now checks at start and pushes at the end
    hub = StandInHub().install(monkeypatch)
    out = tmp_path / "graphs"
    argv = ["--output_dir", str(out), *TINY_GRAPH_FLOW, "--push_to_hub", "--hub_model_id", "me/graphs"]
    argv += ["--hub_token", "hf_test"]
    with as_command_line(GRAPH_FLOW, argv):
        _graph_flow().main(argv)
    names = [call[0] for call in hub.calls]
    assert names == ["whoami", "create_repo", "upload_folder"], hub.calls  # checked first, uploaded last
    assert hub.calls[1] == ("create_repo", "me/graphs", True)
    assert hub.calls[2] == ("upload_folder", "me/graphs", str(out), HUB_IGNORE_PATTERNS)
    assert any(name.startswith("checkpoint-") for name in os.listdir(out))  # on disk, but not uploaded
    assert "README.md" in hub.uploaded_files and "model_index.json" in hub.uploaded_files
    assert "validation_metrics.json" in hub.uploaded_files
    assert not [f for f in hub.uploaded_files if f.startswith(("checkpoint-", "logs"))], hub.uploaded_files


@pytest.mark.parametrize("offline", [True, False])
def test_a_bad_token_or_offline_fails_before_training(tmp_path, monkeypatch, capsys, online, offline):
    hub = StandInHub(error=_http_error(401)).install(monkeypatch)
    if offline:
        monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    out = tmp_path / "graphs"
    argv = ["--output_dir", str(out), *TINY_GRAPH_FLOW, "--push_to_hub", "--hub_token", "hf_bad"]
    with pytest.raises(SystemExit) as exit_info:
        _graph_flow().main(argv)
    assert exit_info.value.code == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    expected = "HF_HUB_OFFLINE is set, so the upload" if offline else "the Hub refuses --hub_token (401 Unauthorized)"
    assert expected in last and "error" in last, last
    assert not out.exists()  # no checkpoint, no log: nothing ran
    assert [call[0] for call in hub.calls] == ([] if offline else ["whoami"])
