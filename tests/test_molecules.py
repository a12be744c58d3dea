"""Molecules as graphs (diffusers_ext.data.molecules) and the molecular rewards (diffusers_ext.rewards.molecules)."""

import gzip

import pytest


pytest.importorskip("rdkit")
nx = pytest.importorskip("networkx")

from rdkit import Chem  # noqa: E402

from diffusers_ext.data.graphs import dense_to_graphs  # noqa: E402
from diffusers_ext.data.molecules import (  # noqa: E402
    ATOM_TYPES,
    graph_to_molecule,
    graph_to_smiles,
    heavy_atom_count,
    is_molsets_available,
    load_moses_smiles,
    molecule_metrics,
    molecules_to_dense,
    moses_splits,
    smiles_to_graph,
)
from diffusers_ext.rewards.molecules import SimilarityReward, qed_reward  # noqa: E402


ROUND_TRIP = [
    "c1ccccc1",  # aromatic ring: kekulized to alternating bonds, aromatic again after sanitization
    "c1cc[nH]c1",  # pyrrole: the N's hydrogen comes back from its valence
    "CC#N",  # a triple bond
    "O=C(O)c1ccc(Cl)cc1Br",  # both halogens
    "CS(=O)(=O)N1CCOCC1",  # hexavalent sulfur
    "Fc1ccc2[nH]ccc2c1",
]


def _graph(atoms, bonds):
    graph = nx.Graph()
    graph.add_nodes_from((i, {"label": ATOM_TYPES.index(a)}) for i, a in enumerate(atoms))
    graph.add_edges_from((u, v, {"label": order}) for u, v, order in bonds)
    return graph


@pytest.mark.parametrize("smiles", ROUND_TRIP)
def test_smiles_graph_molecule_round_trip_is_exact(smiles):
    graph = smiles_to_graph(smiles)
    mol = Chem.MolFromSmiles(smiles)
    assert graph.number_of_nodes() == mol.GetNumHeavyAtoms()
    assert graph.number_of_edges() == mol.GetNumBonds()
    assert graph_to_smiles(graph) == Chem.MolToSmiles(mol)


def test_graphs_are_kekulized_with_the_documented_classes():
    benzene = smiles_to_graph("c1ccccc1")
    assert sorted(d["label"] for _, _, d in benzene.edges(data=True)) == [1, 1, 1, 2, 2, 2]
    assert {d["label"] for _, d in benzene.nodes(data=True)} == {0}
    nitrile = smiles_to_graph("CC#N")
    assert sorted(d["label"] for _, _, d in nitrile.edges(data=True)) == [1, 3]
    assert sorted(d["label"] for _, d in smiles_to_graph("ClCBr").nodes(data=True)) == [0, 5, 6]


def test_dense_round_trip_through_the_pipeline_format():
    X, E, mask = molecules_to_dense(ROUND_TRIP)
    assert X.shape == (len(ROUND_TRIP), 11) and E.shape == (len(ROUND_TRIP), 11, 11)  # 11: the largest
    back = [graph_to_smiles(g) for g in dense_to_graphs(X, E, mask)]
    assert back == [Chem.MolToSmiles(Chem.MolFromSmiles(s)) for s in ROUND_TRIP]


def test_invalid_graphs_are_none_and_score_zero():
    pentavalent = _graph("CCCCCC", [(0, i, 1) for i in range(1, 6)])
    two_fragments = _graph("CCO", [(0, 1, 1)])  # O is isolated
    four_bond_nitrogen = _graph("NCCCC", [(0, i, 1) for i in range(1, 5)])  # neutral N takes 3
    triple_and_double = _graph("CCC", [(0, 1, 3), (1, 2, 2)])
    for graph in (pentavalent, two_fragments, four_bond_nitrogen, triple_and_double, nx.Graph()):
        assert graph_to_molecule(graph) is None
        assert graph_to_smiles(graph) is None
    rewards = qed_reward([pentavalent, two_fragments, smiles_to_graph("CCO")])
    assert rewards[:2] == [0.0, 0.0] and rewards[2] > 0
    assert qed_reward(["not a smiles", "CC.O"]) == [0.0, 0.0]


def test_out_of_vocabulary_classes_raise():
    graph = nx.Graph()
    graph.add_node(0, label=len(ATOM_TYPES))
    with pytest.raises(ValueError, match="class 7"):
        graph_to_molecule(graph)
    with pytest.raises(ValueError, match="expected one of"):
        smiles_to_graph("C[Si](C)C")
    with pytest.raises(ValueError, match="formal charge"):
        smiles_to_graph("C[N+](C)(C)C")
    with pytest.raises(ValueError, match="can parse"):
        smiles_to_graph("C1CC")


def test_qed_reward_on_known_molecules_and_every_input_form():
    # QED values of Bickerton et al.'s definition as implemented in RDKit
    known = {"CC(=O)Oc1ccccc1C(=O)O": 0.5501, "Cn1cnc2c1c(=O)n(C)c(=O)n2C": 0.5385, "c1ccccc1": 0.4426}
    as_graphs = qed_reward([smiles_to_graph(s) for s in known])
    assert as_graphs == pytest.approx(list(known.values()), abs=1e-4)
    assert qed_reward(list(known)) == pytest.approx(as_graphs)
    assert qed_reward([Chem.MolFromSmiles(s) for s in known], num_nodes=[13, 14, 6]) == pytest.approx(as_graphs)
    with pytest.raises(TypeError, match="graphs"):
        qed_reward("CCO")
    with pytest.raises(TypeError, match=r"graphs\[1\]"):
        qed_reward(["CCO", 3])


def test_similarity_reward():
    reward = SimilarityReward("CC(=O)Oc1ccccc1C(=O)O")
    same, close, far, invalid = reward(["OC(=O)c1ccccc1OC(C)=O", "CC(=O)Oc1ccccc1C(=O)OC", "CCCCCC", "C1CC"])
    assert same == 1.0 and 0.3 < close < 1.0 and far < close and invalid == 0.0
    with pytest.raises(ValueError, match="target"):
        SimilarityReward("C1CC")


def test_molecule_metrics_hand_example():
    graphs = [smiles_to_graph(s) for s in ("CCO", "OCC", "c1ccccc1", "CC#N")] + [_graph("CO", [])]
    scores = molecule_metrics(graphs, train_smiles=["c1ccccc1"])
    # 4 of 5 valid; distinct valid: CCO, c1ccccc1, CC#N (3 of 4); novel: CCO, CC#N (2 of 3); V.U.N. 2 of 5
    assert scores == pytest.approx({"valid": 0.8, "unique": 0.75, "novel": 2 / 3, "vun": 0.4})


def test_moses_loader_filters_by_heavy_atoms_elements_charge_and_fragments(tmp_path):
    rows = ["SMILES", "CCO", "c1ccccc1CCCCCCCCCCC", "C[Si](C)C", "C[N+](C)(C)C", "CC.O", "Brc1ccccc1"]
    with gzip.open(tmp_path / "train.csv.gz", "wt") as f:
        f.write("\n".join(rows) + "\n")
    assert heavy_atom_count("Brc1cc[nH]c1Cl") == 7
    assert load_moses_smiles("train", max_heavy_atoms=16, data_dir=str(tmp_path)) == ["CCO", "Brc1ccccc1"]
    assert load_moses_smiles("train", max_heavy_atoms=17, data_dir=str(tmp_path))[1] == "CCCCCCCCCCCc1ccccc1"
    with pytest.raises(ValueError, match="split"):
        load_moses_smiles("valid", data_dir=str(tmp_path))
    with pytest.raises(ValueError, match="test.csv.gz"):
        load_moses_smiles("test", data_dir=str(tmp_path))


@pytest.mark.skipif(not is_molsets_available(), reason="the molsets wheel is not installed (pip install --no-deps)")
@pytest.mark.slow
def test_moses_splits_from_the_molsets_wheel():
    splits = moses_splits(max_heavy_atoms=16, num_train=200, num_val=50, num_test=50, seed=0)
    assert [len(splits[k]) for k in ("train", "val", "test")] == [200, 50, 50]
    assert not set(splits["train"]) & set(splits["val"])
    for smiles in splits["train"][:50]:
        assert Chem.MolFromSmiles(smiles).GetNumHeavyAtoms() <= 16
        assert graph_to_smiles(smiles_to_graph(smiles)) == smiles


def test_missing_rdkit_names_the_extra(monkeypatch):
    monkeypatch.setitem(__import__("sys").modules, "rdkit", None)
    with pytest.raises(ImportError, match=r"diffusers-ext\[molecules\]"):
        qed_reward(["CCO"])
    with pytest.raises(ImportError, match=r"diffusers-ext\[molecules\]"):
        smiles_to_graph("CCO")
