"""Molecular rewards for RL on graph generators (RDKit; the `molecules` extra): `f(graphs, **columns) -> list[float]`.

`graphs` is a list of molecular graphs (`networkx.Graph` with node and edge `"label"` classes, the vocabulary of
`diffusers_ext.data.molecules`: what a [`GraphFlowPipeline`] trained on molecules returns), or of RDKit molecules, or
of SMILES strings. An invalid graph (not sanitizable, or more than one fragment) scores 0. Extra dataset columns
arrive as keyword lists and are ignored.

- [`qed_reward`]: RDKit's QED (quantitative estimate of drug-likeness, in [0, 1]).
- [`SimilarityReward`]: Tanimoto similarity of Morgan fingerprints (radius 2, 2048 bits) to a target molecule.
"""

from ..data.molecules import graph_to_molecule, require_rdkit
from ..utils import check_positive_int


def _molecules(graphs, what: str) -> list:
    """One sanitized RDKit molecule (or `None` for an invalid one) per entry of `graphs`."""
    Chem = require_rdkit(what)
    if not isinstance(graphs, (list, tuple)):
        raise TypeError(
            f"`graphs` must be a list of networkx graphs, RDKit molecules or SMILES strings, got {type(graphs).__name__}."
        )
    out = []
    for index, item in enumerate(graphs):
        if isinstance(item, Chem.Mol):
            mol = Chem.Mol(item)
            try:
                Chem.SanitizeMol(mol)
            except (ValueError, RuntimeError):
                mol = None
            out.append(mol if mol is not None and len(Chem.GetMolFrags(mol)) == 1 else None)
        elif isinstance(item, str):
            mol = Chem.MolFromSmiles(item)
            out.append(mol if mol is not None and len(Chem.GetMolFrags(mol)) == 1 else None)
        elif hasattr(item, "number_of_nodes"):
            out.append(graph_to_molecule(item))
        else:
            raise TypeError(
                f"`graphs[{index}]` is a {type(item).__name__}; expected a networkx graph, an RDKit molecule or a "
                "SMILES string."
            )
    return out


def qed_reward(graphs, **columns) -> list[float]:
    """RDKit's QED of every molecule (in [0, 1]); 0.0 for an invalid one."""
    require_rdkit("qed_reward")
    from rdkit.Chem import QED

    return [0.0 if mol is None else float(QED.qed(mol)) for mol in _molecules(graphs, "qed_reward")]


class SimilarityReward:
    """Tanimoto similarity of Morgan fingerprints (radius `radius`, `num_bits` bits) to `target` (a SMILES string);
    0.0 for an invalid molecule. `SimilarityReward("CCO")(graphs)` -> `list[float]`."""

    def __init__(self, target: str, radius: int = 2, num_bits: int = 2048):
        Chem = require_rdkit("SimilarityReward")
        from rdkit.Chem import rdFingerprintGenerator

        if not isinstance(target, str) or Chem.MolFromSmiles(target) is None:
            raise ValueError(f"`target` must be a SMILES string RDKit can parse, got {target!r}.")
        for name, value in (("radius", radius), ("num_bits", num_bits)):
            check_positive_int(name, value)
        self.target = target
        self._generator = rdFingerprintGenerator.GetMorganGenerator(radius=radius, fpSize=num_bits)
        self._target_fp = self._generator.GetFingerprint(Chem.MolFromSmiles(target))
        self.__name__ = "similarity_reward"

    def __call__(self, graphs, **columns) -> list[float]:
        from rdkit import DataStructs

        out = []
        for mol in _molecules(graphs, "SimilarityReward"):
            if mol is None:
                out.append(0.0)
            else:
                out.append(float(DataStructs.TanimotoSimilarity(self._generator.GetFingerprint(mol), self._target_fp)))
        return out
