"""Small molecules as graphs: the MOSES set (from the `molsets` wheel), SMILES <-> graph conversion and validity.

A molecule is a graph of its heavy atoms (hydrogens implicit). Node classes are atom types, edge classes are
*kekulized* bond orders (aromatic rings are written with alternating single and double bonds, so no aromatic class
and no explicit `[nH]` is needed: hydrogens come back from the valences):

| node class | 0 | 1 | 2 | 3 | 4 | 5 | 6 |
| --- | --- | --- | --- | --- | --- | --- | --- |
| atom | C | N | O | F | S | Cl | Br |

| edge class | 0 | 1 | 2 | 3 |
| --- | --- | --- | --- | --- |
| bond | none | single | double | triple |

These seven elements are every element of the MOSES molecules with at most 16 heavy atoms (all neutral). A graph
(`networkx.Graph`, node and edge attribute `"label"` = class, the format of [`GraphFlowPipeline`]'s
`output_type="networkx"`) turns back into an RDKit molecule with [`graph_to_molecule`]; it is *valid* when RDKit
sanitizes it and it is one connected component.

Data: [`load_moses_smiles`] reads the `train.csv.gz` / `test.csv.gz` files of the MIT-licensed `molsets` 0.3.1 wheel
(the real MOSES set, 1,584,663 training SMILES). The wheel's own dependencies pin `pomegranate==0.12.0`, which has
no wheel for current Pythons, so install it alone: `pip install --no-deps molsets==0.3.1`. It is never imported
(importing `moses` pulls in `fcd_torch`): its files are located through `importlib.util.find_spec`. RDKit is the
optional extra `molecules` (`pip install "diffusers-ext[molecules]"`).
"""

import gzip
import importlib.util
import os
import re

import numpy as np

from ..utils import check_positive_int
from .graphs import graphs_to_dense, require_networkx


ATOM_TYPES = ("C", "N", "O", "F", "S", "Cl", "Br")
BOND_ORDERS = (None, 1, 2, 3)  # edge class -> kekulized bond order (0: no bond)
NUM_NODE_CLASSES = len(ATOM_TYPES)
NUM_EDGE_CLASSES = len(BOND_ORDERS)
MOSES_SPLITS = {"train": "train.csv.gz", "test": "test.csv.gz", "test_scaffolds": "test_scaffolds.csv.gz"}
MOSES_INSTALL_HINT = (
    "the MOSES data ships in the `molsets` wheel; install it without its dependencies (they pin an unbuildable "
    "pomegranate): `pip install --no-deps molsets==0.3.1`"
)
# one token per heavy atom of a SMILES string without explicit hydrogens outside brackets (MOSES has none):
# a bracket atom, a two-letter halogen, an organic-subset atom, or an aromatic one
_ATOM_TOKEN = re.compile(r"\[[^\]]+\]|Br|Cl|[BCNOPSFI]|[bcnops]")


def require_rdkit(what: str):
    """Import `rdkit.Chem`, or raise an `ImportError` saying that `what` needs the `molecules` extra."""
    try:
        from rdkit import Chem, RDLogger
    except ImportError as error:
        raise ImportError(
            f"{what} needs RDKit: install it with `pip install diffusers-ext[molecules]` (or `pip install rdkit`)."
        ) from error
    RDLogger.DisableLog("rdApp.*")  # invalid generated graphs are expected; their sanitize errors are not news
    return Chem


def _bond_class(bond) -> int:
    Chem = require_rdkit("molecule_to_graph")
    orders = {Chem.BondType.SINGLE: 1, Chem.BondType.DOUBLE: 2, Chem.BondType.TRIPLE: 3}
    if bond.GetBondType() not in orders:
        raise ValueError(
            f"bond {bond.GetIdx()} has type {bond.GetBondType()}; expected a kekulized single, double or triple bond."
        )
    return orders[bond.GetBondType()]


def molecule_to_graph(molecule):
    """An RDKit molecule to a `networkx.Graph` of its heavy atoms: node `"label"` = index in `ATOM_TYPES`, edge
    `"label"` = kekulized bond order (1, 2, 3).

    Raises:
        ValueError: an atom outside `ATOM_TYPES`, a charged atom, or a bond that does not kekulize.
    """
    Chem = require_rdkit("molecule_to_graph")
    nx = require_networkx("molecule_to_graph")
    if not isinstance(molecule, Chem.Mol):
        raise TypeError(f"`molecule` must be an rdkit.Chem.Mol, got {type(molecule).__name__}.")
    mol = Chem.RemoveHs(molecule)
    Chem.Kekulize(mol, clearAromaticFlags=True)
    graph = nx.Graph()
    for atom in mol.GetAtoms():
        symbol = atom.GetSymbol()
        if symbol not in ATOM_TYPES:
            raise ValueError(f"atom {atom.GetIdx()} is {symbol!r}; expected one of {ATOM_TYPES}.")
        if atom.GetFormalCharge() != 0:
            raise ValueError(
                f"atom {atom.GetIdx()} ({symbol}) has formal charge {atom.GetFormalCharge()}; expected neutral atoms."
            )
        graph.add_node(atom.GetIdx(), label=ATOM_TYPES.index(symbol))
    for bond in mol.GetBonds():
        graph.add_edge(bond.GetBeginAtomIdx(), bond.GetEndAtomIdx(), label=_bond_class(bond))
    return graph


def smiles_to_graph(smiles: str):
    """A SMILES string to a molecular graph ([`molecule_to_graph`]); a `ValueError` if RDKit cannot parse it."""
    Chem = require_rdkit("smiles_to_graph")
    if not isinstance(smiles, str):
        raise TypeError(f"`smiles` must be a str, got {type(smiles).__name__}.")
    molecule = Chem.MolFromSmiles(smiles)
    if molecule is None:
        raise ValueError(f"`smiles` {smiles!r} is not a SMILES string RDKit can parse.")
    return molecule_to_graph(molecule)


def graph_to_molecule(graph):
    """A molecular graph (node and edge `"label"` classes as in [`molecule_to_graph`]) to a sanitized RDKit
    molecule, or `None` if it is not a valid molecule: empty, not one connected component, or rejected by RDKit's
    sanitization (valence, kekulization).

    Raises:
        ValueError: a node or edge class outside the vocabulary (not a chemistry failure: a wrong input).
    """
    Chem = require_rdkit("graph_to_molecule")
    if not hasattr(graph, "number_of_nodes"):
        raise TypeError(f"`graph` must be a networkx graph, got {type(graph).__name__}.")
    if graph.number_of_nodes() == 0:
        return None
    bond_types = {1: Chem.BondType.SINGLE, 2: Chem.BondType.DOUBLE, 3: Chem.BondType.TRIPLE}
    mol = Chem.RWMol()
    index = {}
    for node, data in graph.nodes(data=True):
        label = data.get("label", 0)
        if not isinstance(label, (int, np.integer)) or not 0 <= label < NUM_NODE_CLASSES:
            raise ValueError(f"node {node!r} has class {label!r}; expected an int in [0, {NUM_NODE_CLASSES}).")
        index[node] = mol.AddAtom(Chem.Atom(ATOM_TYPES[int(label)]))
    for u, v, data in graph.edges(data=True):
        label = data.get("label", 1)
        if not isinstance(label, (int, np.integer)) or not 1 <= label < NUM_EDGE_CLASSES:
            raise ValueError(f"edge {(u, v)!r} has class {label!r}; expected an int in [1, {NUM_EDGE_CLASSES}).")
        if u != v:
            mol.AddBond(index[u], index[v], bond_types[int(label)])
    mol = mol.GetMol()
    if len(Chem.GetMolFrags(mol)) != 1:
        return None
    try:
        Chem.SanitizeMol(mol)
    except (ValueError, RuntimeError):  # RDKit's sanitize exceptions (valence, kekulize) derive from these
        return None
    return mol


def graph_to_smiles(graph) -> str | None:
    """The canonical SMILES of a valid molecular graph, or `None` if it is invalid ([`graph_to_molecule`])."""
    Chem = require_rdkit("graph_to_smiles")
    mol = graph_to_molecule(graph)
    return None if mol is None else Chem.MolToSmiles(mol)


def canonical_smiles(smiles: str) -> str | None:
    """RDKit's canonical form of `smiles` (aromatic notation), or `None` if it does not parse."""
    Chem = require_rdkit("canonical_smiles")
    mol = Chem.MolFromSmiles(smiles)
    return None if mol is None else Chem.MolToSmiles(mol)


def heavy_atom_count(smiles: str) -> int:
    """Heavy atoms of a SMILES string by counting atom tokens (no RDKit); exact when hydrogens appear only inside
    brackets, as in MOSES."""
    return len(_ATOM_TOKEN.findall(smiles))


def is_molsets_available() -> bool:
    """Whether the `molsets` wheel (package `moses`) is installed; nothing is imported."""
    return importlib.util.find_spec("moses") is not None


def moses_data_dir() -> str:
    """The folder holding the MOSES csv files of the installed `molsets` wheel; an `ImportError` if it is absent."""
    spec = importlib.util.find_spec("moses")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(f"`molsets` is not installed: {MOSES_INSTALL_HINT}.")
    folder = os.path.join(list(spec.submodule_search_locations)[0], "dataset", "data")
    if not os.path.isfile(os.path.join(folder, MOSES_SPLITS["train"])):
        raise ImportError(f"`moses` is installed but {folder} has no {MOSES_SPLITS['train']}: {MOSES_INSTALL_HINT}.")
    return folder


def load_moses_smiles(split: str = "train", max_heavy_atoms: int = 16, data_dir: str | None = None) -> list[str]:
    """The MOSES SMILES of `split` (`"train"`, `"test"` or `"test_scaffolds"`) with at most `max_heavy_atoms` heavy
    atoms, every element in `ATOM_TYPES`, neutral and in one fragment, in file order, as RDKit canonical SMILES.

    A fast token count discards the larger molecules before RDKit parses the rest (MOSES train: 21,084 of
    1,584,663 have <= 16 heavy atoms, read in about 8 s).
    """
    Chem = require_rdkit("load_moses_smiles")
    if split not in MOSES_SPLITS:
        raise ValueError(f"`split` must be one of {tuple(MOSES_SPLITS)}, got {split!r}.")
    check_positive_int("max_heavy_atoms", max_heavy_atoms)
    folder = data_dir if data_dir is not None else moses_data_dir()
    path = os.path.join(folder, MOSES_SPLITS[split])
    if not os.path.isfile(path):
        raise ValueError(f"`data_dir` {folder!r} has no {MOSES_SPLITS[split]}.")
    with gzip.open(path, "rt", encoding="utf-8") as f:
        lines = f.read().splitlines()
    if not lines or lines[0].strip().upper() != "SMILES":
        raise ValueError(f"{path}: expected a csv with the header 'SMILES', got {lines[:1]!r}.")
    out = []
    for smiles in lines[1:]:
        smiles = smiles.strip()
        if not smiles or heavy_atom_count(smiles) > max_heavy_atoms:
            continue
        mol = Chem.MolFromSmiles(smiles)
        if mol is None or mol.GetNumHeavyAtoms() > max_heavy_atoms or len(Chem.GetMolFrags(mol)) != 1:
            continue
        if any(a.GetSymbol() not in ATOM_TYPES or a.GetFormalCharge() != 0 for a in mol.GetAtoms()):
            continue
        out.append(Chem.MolToSmiles(mol))
    return out


def moses_splits(
    max_heavy_atoms: int = 16,
    num_train: int | None = None,
    num_val: int = 1000,
    num_test: int | None = None,
    seed: int = 0,
    data_dir: str | None = None,
) -> dict[str, list[str]]:
    """Train / validation / test SMILES of the small MOSES molecules.

    `train` and `val` are disjoint random subsets (drawn with `seed`) of the filtered MOSES training file, `test` the
    filtered MOSES test file (its first `num_test`, or all). `num_train=None` keeps every remaining training
    molecule.
    """
    for name, value, minimum in (("num_train", num_train, 1), ("num_val", num_val, 0), ("num_test", num_test, 1)):
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < minimum):
            raise ValueError(f"`{name}` must be None or an int >= {minimum}, got {value!r}.")
    pool = load_moses_smiles("train", max_heavy_atoms, data_dir)
    order = np.random.default_rng(seed).permutation(len(pool))
    if num_val + (num_train or 1) > len(pool):
        raise ValueError(
            f"`num_train` + `num_val` = {(num_train or 1) + num_val} exceeds the {len(pool)} MOSES training molecules "
            f"with <= {max_heavy_atoms} heavy atoms."
        )
    val = [pool[i] for i in order[:num_val]]
    rest = order[num_val:] if num_train is None else order[num_val : num_val + num_train]
    test = load_moses_smiles("test", max_heavy_atoms, data_dir)
    return {"train": [pool[i] for i in rest], "val": val, "test": test if num_test is None else test[:num_test]}


def molecules_to_dense(smiles: list[str], max_num_nodes: int | None = None):
    """SMILES strings to padded class tensors `(node_classes (B, N), edge_classes (B, N, N), node_mask (B, N))`."""
    if not isinstance(smiles, (list, tuple)) or not smiles or not all(isinstance(s, str) for s in smiles):
        raise ValueError(f"`smiles` must be a non-empty list of SMILES strings, got {type(smiles).__name__}.")
    return graphs_to_dense([smiles_to_graph(s) for s in smiles], max_num_nodes)


def smiles_metrics(smiles: list, train_smiles) -> dict[str, float]:
    """Validity, uniqueness and novelty of generated molecules given as canonical SMILES (`None` = invalid), as
    fractions (the usual definitions):

    - `valid`: valid / all;
    - `unique`: distinct SMILES among the valid ones / valid ones;
    - `novel`: distinct valid SMILES not in `train_smiles` (canonical) / distinct valid ones;
    - `vun`: distinct, novel, valid molecules / all.
    """
    if not isinstance(smiles, (list, tuple)) or not smiles:
        raise ValueError(f"`smiles` must be a non-empty list of SMILES strings or None, got {type(smiles).__name__}.")
    train = set(train_smiles)
    valid = [s for s in smiles if s is not None]
    distinct = set(valid)
    novel = distinct - train
    return {
        "valid": len(valid) / len(smiles),
        "unique": len(distinct) / len(valid) if valid else 0.0,
        "novel": len(novel) / len(distinct) if distinct else 0.0,
        "vun": len(novel) / len(smiles),
    }


def molecule_metrics(graphs: list, train_smiles) -> dict[str, float]:
    """[`smiles_metrics`] of generated molecular graphs (invalid graphs, see [`graph_to_molecule`], count as
    invalid): `valid`, `unique`, `novel` and `vun` fractions."""
    if not isinstance(graphs, (list, tuple)) or not graphs:
        raise ValueError(f"`graphs` must be a non-empty list of networkx graphs, got {type(graphs).__name__}.")
    return smiles_metrics([graph_to_smiles(g) for g in graphs], train_smiles)
