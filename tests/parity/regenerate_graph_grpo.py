"""Regenerate `fixtures/graph_grpo.json`: Graph-GRPO's analytic rate matrix (Eq. 28,
`ContinuousRateMatrixDesigner.compute_graph_rate_matrix`) computed by the reference code on fixed inputs.

The reference is not part of this repository. Export its file and run

    git -C MIRROR show HEAD:src/flow_matching/rate_matrix_continuous.py > REF/rate_matrix_continuous.py
    git -C MIRROR log -1 --format=%H > REF/REVISION
    python tests/parity/regenerate_graph_grpo.py --reference_dir REF

The reference adds 1e-6 to `1 - t` in the denominator; the fixture records its outputs as they are, and the test
compares at a tolerance that covers that offset. `build_inputs` is shared with the test.
"""

import argparse
import importlib.util
import json
import types
from pathlib import Path

import torch
from parity_utils import reference_commit


FIXTURE = Path(__file__).parent / "fixtures" / "graph_grpo.json"
NODE_P0 = [0.6, 0.3, 0.1]
EDGE_P0 = [0.7, 0.2, 0.1]
TIMES = [0.1, 0.5, 0.8]


def build_inputs() -> dict[str, torch.Tensor]:
    """Three graphs of 4 nodes (the last with one padding node), 3 node and 3 edge classes, float64."""
    g = torch.Generator().manual_seed(30)
    X = torch.randint(0, 3, (3, 4), generator=g)
    E = torch.randint(0, 3, (3, 4, 4), generator=g).triu(1)
    E = E + E.transpose(1, 2)
    mask = torch.ones(3, 4, dtype=torch.bool)
    mask[2, 3] = False
    X, E = X * mask, E * (mask.unsqueeze(1) & mask.unsqueeze(2))
    node_probs = torch.randn(3, 4, 3, generator=g, dtype=torch.float64).softmax(-1)
    edge_logits = torch.randn(3, 4, 4, 3, generator=g, dtype=torch.float64)
    edge_probs = ((edge_logits + edge_logits.transpose(1, 2)) / 2).softmax(-1)
    return {
        "X": X,
        "E": E,
        "node_mask": mask,
        "node_probs": node_probs,
        "edge_probs": edge_probs,
        "t": torch.tensor(TIMES, dtype=torch.float64),
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--reference_dir", required=True)
    args = parser.parse_args()
    path = Path(args.reference_dir) / "rate_matrix_continuous.py"
    spec = importlib.util.spec_from_file_location("rate_matrix_continuous", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    inputs = build_inputs()
    limit = types.SimpleNamespace(
        X=torch.tensor(NODE_P0, dtype=torch.float64), E=torch.tensor(EDGE_P0, dtype=torch.float64)
    )
    designer = module.ContinuousRateMatrixDesigner(limit)
    X_onehot = torch.nn.functional.one_hot(inputs["X"], 3).double()
    E_onehot = torch.nn.functional.one_hot(inputs["E"], 3).double()
    R_X, R_E = designer.compute_graph_rate_matrix(
        inputs["t"].view(-1, 1),
        inputs["node_mask"],
        (X_onehot, E_onehot),
        (inputs["node_probs"], inputs["edge_probs"]),
    )
    FIXTURE.write_text(
        json.dumps(
            {
                "reference": "Zhubaoheng/Graph-GRPO src/flow_matching/rate_matrix_continuous.py",
                "commit": reference_commit(args.reference_dir),
                "node_marginals": NODE_P0,
                "edge_marginals": EDGE_P0,
                "times": TIMES,
                "rate_X": R_X.tolist(),
                "rate_E": R_E.tolist(),
            },
            indent=1,
        )
        + "\n"
    )


if __name__ == "__main__":
    main()
