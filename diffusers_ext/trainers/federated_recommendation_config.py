"""[`FederatedRecommendationConfig`]: the options of [`FederatedRecommendationTrainer`]."""

from dataclasses import dataclass, field

from ..utils import check_positive_int, public


METHODS = ("distributional", "fedmf", "fedncf", "pfedrec")
EMBEDDING_ASSIGNMENTS = ("best_scoring", "random_half")


@public
@dataclass
class FederatedRecommendationConfig:
    r"""
    Options of [`FederatedRecommendationTrainer`]: one client per user, `num_rounds` rounds; in each round a sample of
    clients trains locally from the shared models (item embeddings and biases, and for `"distributional"` the
    user-embedding denoiser), and the server averages what they send back (FedAvg, weighted by their training items).
    Each client's own user embeddings never leave it.

    `method="distributional"`: each client keeps `num_user_embeddings` embeddings, each fitted on its own share of
    the client's positives (`embedding_assignment`), and trains the denoiser to generate them from the client's
    interaction summary; recommendation draws `num_samples` embeddings from the denoiser and averages their scores.
    `embedding_assignment="random_half"`: each embedding on a fixed random half of the positives (drawn once per
    client; the default, chosen on validation). `"best_scoring"`: at every local update each positive goes to the
    embedding that scores it highest (hard EM, as multi-interest models assign items to interests, meant to make
    different embeddings lean towards different tastes); an embedding left with none takes the positive it scores
    best from the largest group. `method="fedmf"`: one embedding per client, scored directly (FedMF, the
    single-embedding baseline). `method="fedncf"`: one embedding per client scored by neural collaborative filtering
    ([`NeuralItemScoringModel`]: NeuMF's GMF and MLP branches, shared). `method="pfedrec"`: PFedRec's dual
    personalisation: each client keeps its own score function (a weight vector and a bias over the item
    embeddings) and scores with its own copy of the item embeddings, fine-tuned from the shared ones by one local
    update at evaluation.

    `centralised=True` is the upper reference of any method: the same model trained on the pooled data, each round a
    pass over every user in a seeded order (sequential SGD, no sampling, no averaging).
    """

    output_dir: str = field(default="federated-recommendation", metadata={"help": "Where the result is saved."})
    method: str = field(default="distributional", metadata={"help": f"One of {METHODS}."})
    embedding_dim: int = field(default=32, metadata={"help": "Latent size of users and items (PFedRec's 32)."})
    num_rounds: int = field(default=100, metadata={"help": "Federated rounds."})
    clients_per_round: int = field(default=64, metadata={"help": "Clients sampled per round (without replacement)."})
    local_epochs: int = field(default=1, metadata={"help": "Passes over a client's positives per round."})
    negatives_per_positive: int = field(default=4, metadata={"help": "Sampled unobserved items per positive."})
    learning_rate: float = field(default=0.05, metadata={"help": "SGD step of the local updates (all parameters)."})
    num_user_embeddings: int = field(default=4, metadata={"help": "Embeddings per client ('distributional')."})
    embedding_assignment: str = field(
        default="random_half",
        metadata={"help": f"Which positives fit each embedding ('distributional'): one of {EMBEDDING_ASSIGNMENTS}."},
    )
    denoiser_hidden_size: int = field(default=64, metadata={"help": "Width of the user-embedding denoiser."})
    denoiser_layers: int = field(default=2, metadata={"help": "Residual blocks of the denoiser."})
    denoiser_learning_rate: float = field(default=1e-3, metadata={"help": "Adam step of the denoiser, per client."})
    num_train_timesteps: int = field(default=100, metadata={"help": "DDPM timesteps of the denoiser."})
    num_samples: int = field(default=8, metadata={"help": "Embeddings drawn per user at evaluation (K)."})
    num_inference_steps: int = field(default=20, metadata={"help": "DDIM steps at evaluation."})
    ncf_hidden_size: int = field(default=64, metadata={"help": "Width of FedNCF's MLP branch ('fedncf')."})
    centralised: bool = field(
        default=False, metadata={"help": "Train on pooled data (the upper reference) instead of federating."}
    )
    top_k: int = field(default=10, metadata={"help": "k of HR@k and NDCG@k."})
    seed: int = field(default=0, metadata={"help": "Seeds initialisation, client sampling, negatives and noise."})

    def __post_init__(self):
        if self.method not in METHODS:
            raise ValueError(f"`method` must be one of {METHODS}, got {self.method!r}.")
        if self.embedding_assignment not in EMBEDDING_ASSIGNMENTS:
            raise ValueError(
                f"`embedding_assignment` must be one of {EMBEDDING_ASSIGNMENTS}, got {self.embedding_assignment!r}."
            )
        for name in (
            "embedding_dim",
            "num_rounds",
            "clients_per_round",
            "local_epochs",
            "negatives_per_positive",
            "num_user_embeddings",
            "denoiser_hidden_size",
            "denoiser_layers",
            "num_train_timesteps",
            "num_samples",
            "num_inference_steps",
            "ncf_hidden_size",
            "top_k",
        ):
            check_positive_int(name, getattr(self, name))
        if not isinstance(self.centralised, bool):
            raise ValueError(f"`centralised` must be a bool, got {self.centralised!r}.")
        for name in ("learning_rate", "denoiser_learning_rate"):
            if not getattr(self, name) > 0:
                raise ValueError(f"`{name}` must be positive, got {getattr(self, name)!r}.")
