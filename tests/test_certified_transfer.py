"""Certified few-shot transfer: the finite-class certificate (the paper's arithmetic), the adapter vectoriser over
peft, ParameterDiffusionModel and SampleThenEvaluatePipeline (sampling strictly before evaluation, save/load)."""

import math

import pytest
import torch
from diffusers import DDIMScheduler, DDPMScheduler

from diffusers_ext import (
    AdapterVectorizer,
    ParameterDiffusionModel,
    SampleThenEvaluatePipeline,
    finite_class_certificate,
    load_pipeline,
)
from diffusers_ext.pipelines.certified_transfer.certificate import bernoulli_kl, complexity_term, kl_inverse
from diffusers_ext.testing import get_dummy_components, get_dummy_inputs
from diffusers_ext.testing.outputs import count_module_forwards


# certificate --------------------------------------------------------------------------------------------------


def test_paper_arithmetic_complexity_0284():
    # STEEL (arXiv 2502.06970): n = 80 (5-way 16-shot), |Theta| = 20,000, delta = 0.05 -> 0.284
    assert round(complexity_term(80, 20_000, 0.05), 3) == 0.284
    assert finite_class_certificate(0.0, 80, 20_000, 0.05) == pytest.approx(0.2839368, abs=1e-6)
    # the table of ../shared/reference/steel.md, section 2
    table = {100: 0.218, 1_000: 0.249, 20_000: 0.284, 10**6: 0.324}
    for size, value in table.items():
        assert round(complexity_term(80, size), 3) == value


def test_kl_inverse_reproduces_reference_maurer_figures():
    # reference section 2: with Maurer's constant ln(2 sqrt(n) / delta), R <= 0.179 at r = 0 and 0.376 at r = 0.1
    budget = (math.log(20_000) + math.log(2 * math.sqrt(80) / 0.05)) / 80
    assert float(kl_inverse(0.0, budget)) == pytest.approx(0.179, abs=5e-4)
    assert float(kl_inverse(0.1, budget)) == pytest.approx(0.376, abs=5e-4)
    # the inverse sits on the kl level set
    p = kl_inverse(torch.tensor([0.1, 0.4]), budget)
    assert torch.allclose(bernoulli_kl(torch.tensor([0.1, 0.4]), p), torch.full((2,), budget, dtype=torch.float64))


def test_kl_bound_is_never_looser_than_hoeffding():
    risks = torch.linspace(0, 1, 201)
    for n in (5, 20, 80, 400):
        for size in (1, 10, 2_000, 20_000, 10**6):
            for delta in (0.01, 0.05, 0.3):
                hoeffding = finite_class_certificate(risks, n, size, delta, "hoeffding")
                kl = finite_class_certificate(risks, n, size, delta, "kl")
                assert (kl <= hoeffding + 1e-9).all(), (n, size, delta)
                assert (kl >= risks.double() - 1e-12).all() and (kl <= 1).all()
    assert finite_class_certificate(0.0, 80, 20_000, kind="kl") < 0.16  # much tighter at r = 0 (0.149 vs 0.284)


def test_certificate_holds_at_rate_delta_by_simulation():
    # a fixed class of 50 hypotheses with true risks 0.3, n = 40: the bound for *all* members fails in <= delta
    generator = torch.Generator().manual_seed(0)
    true_risk, n, size = 0.3, 40, 50
    draws = (torch.rand(4000, size, n, generator=generator) < true_risk).float().mean(dim=2)
    for kind in ("hoeffding", "kl"):
        bound = finite_class_certificate(draws, n, size, 0.05, kind)
        violated = (bound < true_risk).any(dim=1).float().mean()
        assert violated <= 0.05


def test_certificate_rejects_bad_arguments():
    with pytest.raises(ValueError, match="num_samples"):
        finite_class_certificate(0.1, 0, 10)
    with pytest.raises(ValueError, match="num_hypotheses"):
        finite_class_certificate(0.1, 10, 0)
    with pytest.raises(ValueError, match="delta"):
        finite_class_certificate(0.1, 10, 10, delta=0.0)
    with pytest.raises(ValueError, match="kind"):
        finite_class_certificate(0.1, 10, 10, kind="bernstein")
    with pytest.raises(ValueError, match="empirical_risk"):
        finite_class_certificate(1.2, 10, 10)


# vectoriser ---------------------------------------------------------------------------------------------------


def _tiny_peft_model(seed=0):
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(seed)
    base = torch.nn.Sequential(torch.nn.Conv2d(1, 4, 3, padding=1), torch.nn.Flatten(), torch.nn.Linear(256, 5))
    model = get_peft_model(base, LoraConfig(r=2, lora_alpha=2, target_modules=["0", "2"], init_lora_weights=False))
    return model


def test_vectorizer_round_trip_is_exact_over_peft():
    from peft import get_peft_model_state_dict

    model = _tiny_peft_model()
    vectorizer = AdapterVectorizer.from_peft_model(model)
    state = get_peft_model_state_dict(model)
    assert vectorizer.dim == sum(v.numel() for v in state.values())
    vector = vectorizer.vectorize(state)
    back = vectorizer.to_state_dict(vector)
    assert set(back) == set(state) and all(torch.equal(back[k], state[k]) for k in state)
    # writing a vector into another model gives the same adapter and the same function
    other = _tiny_peft_model()  # the same frozen base, other LoRA weights
    with torch.no_grad():
        for name, param in other.named_parameters():
            if "lora_" in name:
                param.normal_()
    x = torch.randn(3, 1, 8, 8)
    assert not torch.allclose(other(x), model(x))
    vectorizer.load_into(other, vector)
    assert torch.equal(vectorizer.vectorize(get_peft_model_state_dict(other)), vector)
    assert torch.allclose(other(x), model(x), atol=1e-6)


def test_vectorizer_standardization_and_errors():
    vectorizer = AdapterVectorizer(["a", "b"], [(2,), (1, 2)])
    vectors = torch.randn(10, 4) * torch.tensor([1.0, 2.0, 3.0, 4.0]) + 5
    vectorizer.fit(vectors)
    z = vectorizer.standardize(vectors)
    assert torch.allclose(z.mean(0), torch.zeros(4), atol=1e-5) and torch.allclose(z.std(0), torch.ones(4))
    assert torch.allclose(vectorizer.destandardize(z), vectors, atol=1e-5)
    with pytest.raises(ValueError, match="vector"):
        vectorizer.to_state_dict(torch.zeros(5))
    with pytest.raises(ValueError, match="missing"):
        vectorizer.vectorize({"a": torch.zeros(2)})
    with pytest.raises(ValueError, match="vectors"):
        vectorizer.fit(torch.zeros(1, 4))


def test_canonical_lora_factors_keep_the_function_and_forget_the_factorisation():
    from peft import get_peft_model_state_dict

    model = _tiny_peft_model()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_" in name:
                param.normal_()
    vectorizer = AdapterVectorizer.from_peft_model(model)
    pairs = vectorizer.lora_pairs()
    assert pairs and all("lora_A" in vectorizer.parameter_names[a] for a, _ in pairs)
    vector = vectorizer.vectorize(get_peft_model_state_dict(model))
    # another factorisation of the same products: (B G^-1, G A) for a random invertible G per pair
    generator = torch.Generator().manual_seed(0)
    chunks = list(torch.split(vector.double(), vectorizer.sizes))
    for a, b in pairs:
        rank = vectorizer.parameter_shapes[a][0]
        g = torch.randn(rank, rank, generator=generator, dtype=torch.float64) + 2 * torch.eye(rank)
        lora_a, lora_b = chunks[a].reshape(rank, -1), chunks[b].reshape(-1, rank)
        chunks[a], chunks[b] = (g @ lora_a).reshape(-1), (lora_b @ torch.linalg.inv(g)).reshape(-1)
    other = torch.cat(chunks).float()
    assert (other - vector).abs().max() > 0.1
    canonical = vectorizer.canonicalize_lora(torch.stack([vector, other]))
    assert canonical.shape == (2, vectorizer.dim)
    assert torch.allclose(canonical[0], canonical[1], atol=1e-4)  # the factorisation is forgotten
    assert torch.allclose(vectorizer.canonicalize_lora(canonical), canonical, atol=1e-5)  # idempotent
    # the adapted model computes the same function
    x = torch.randn(3, 1, 8, 8)
    expected = model(x)
    vectorizer.load_into(model, canonical[1])
    assert torch.allclose(model(x), expected, atol=1e-4)
    # the factors are balanced (equal column / row norms) and sign-fixed
    for a, b in pairs:
        rank = vectorizer.parameter_shapes[a][0]
        parts = torch.split(canonical[0], vectorizer.sizes)
        lora_a, lora_b = parts[a].reshape(rank, -1), parts[b].reshape(-1, rank)
        assert torch.allclose(lora_a.norm(dim=1), lora_b.norm(dim=0), rtol=1e-4)
        peak = lora_b.abs().argmax(dim=0)
        assert (lora_b[peak, torch.arange(rank)] > 0).all()
    with pytest.raises(ValueError, match="no `lora_A`"):
        AdapterVectorizer(["a"], [(2,)]).canonicalize_lora(torch.zeros(1, 2))
    with pytest.raises(ValueError, match="partner"):
        AdapterVectorizer(["x.lora_A.w"], [(2, 3)]).canonicalize_lora(torch.zeros(1, 6))
    with pytest.raises(ValueError, match="vectors"):
        vectorizer.canonicalize_lora(vector)


# model and pipeline -------------------------------------------------------------------------------------------


def test_parameter_diffusion_model_shapes_and_errors():
    model = ParameterDiffusionModel(vector_dim=6, hidden_size=8, num_layers=1, time_embedding_dim=4)
    out = model(torch.randn(3, 6), torch.tensor([1, 5, 9])).sample
    assert out.shape == (3, 6)
    assert model(torch.randn(3, 6), 4).sample.shape == (3, 6)
    with pytest.raises(ValueError, match="sample"):
        model(torch.randn(3, 5), 1)
    with pytest.raises(ValueError, match="parameter_shapes"):
        ParameterDiffusionModel(vector_dim=6, parameter_names=["a"], parameter_shapes=[[2, 2]])


def _pipeline(seed=0):
    pipe = SampleThenEvaluatePipeline(**get_dummy_components(SampleThenEvaluatePipeline, seed=seed))
    pipe.set_progress_bar_config(disable=True)
    return pipe


@pytest.mark.support_cell("certified_transfer", "pack")
def test_every_hypothesis_is_drawn_before_evaluate_fn_is_called():
    pipe = _pipeline()
    events = []

    def callback(pipe_, step, timestep, callback_kwargs):
        events.append(("step", step))
        return {}

    def evaluate_fn(hypotheses):
        events.append(("evaluate", hypotheses.shape[0]))
        return torch.sigmoid(hypotheses.mean(dim=1))

    inputs = get_dummy_inputs(SampleThenEvaluatePipeline)
    inputs.update(evaluate_fn=evaluate_fn, num_hypotheses=10, sampling_batch_size=4, output_type="pt")
    with count_module_forwards(pipe) as counts:
        out = pipe(**inputs, callback_on_step_end=callback)
        forwards_at_end = dict(counts)
    steps = inputs["num_inference_steps"]
    # three chunks (4 + 4 + 2) of every step, then exactly one evaluation of all 10 hypotheses
    assert events == [("step", i) for _ in range(3) for i in range(steps)] + [("evaluate", 10)]
    assert forwards_at_end["model"] == 3 * steps
    assert out.hypotheses.shape == (10, 12) and out.risks.shape == (10,)
    assert out.best_index == int(torch.argmin(out.risks))
    assert torch.equal(out.best_adapter, out.hypotheses[out.best_index])
    assert out.empirical_risk == pytest.approx(float(out.risks.min()))
    assert out.certificate == pytest.approx(finite_class_certificate(out.empirical_risk, 20, 10, 0.05))
    kl = pipe(**{**inputs, "generator": torch.Generator().manual_seed(0)}, bound="kl")
    assert kl.certificate <= out.certificate + 1e-9


def test_evaluate_fn_output_is_validated():
    pipe = _pipeline()
    inputs = get_dummy_inputs(SampleThenEvaluatePipeline)
    with pytest.raises(ValueError, match="evaluate_fn"):
        pipe(**{**inputs, "evaluate_fn": lambda h: torch.zeros(3)})
    with pytest.raises(ValueError, match="evaluate_fn"):
        pipe(**{**inputs, "evaluate_fn": lambda h: torch.full((h.shape[0],), 2.0)})
    with pytest.raises(ValueError, match="`generator` is a list of 1 generators, but `num_hypotheses` makes a batch"):
        pipe(**{**inputs, "generator": [torch.Generator()]})
    with pytest.raises(TypeError, match="generator"):
        pipe(**{**inputs, "generator": "seed"})


def test_samples_are_destandardized_and_decode_to_state_dicts():
    pipe = _pipeline()
    pipe.model.set_standardization(torch.full((12,), 100.0), torch.full((12,), 0.001))
    out = pipe(**{**get_dummy_inputs(SampleThenEvaluatePipeline), "evaluate_fn": lambda h: torch.zeros(h.shape[0])})
    assert abs(out.hypotheses - 100.0).max() < 0.1
    state = pipe.vectorizer.to_state_dict(torch.as_tensor(out.best_adapter))
    assert {k: tuple(v.shape) for k, v in state.items()} == {"a.lora_A.weight": (2, 3), "a.lora_B.weight": (3, 2)}


def test_scheduler_swap_and_save_load(tmp_path):
    pipe = _pipeline()
    pipe.scheduler = DDIMScheduler.from_config(pipe.scheduler.config)
    inputs = get_dummy_inputs(SampleThenEvaluatePipeline)
    expected = pipe(**inputs)
    pipe.save_pretrained(tmp_path)
    for loaded in (SampleThenEvaluatePipeline.from_pretrained(tmp_path), load_pipeline(tmp_path)):
        loaded.set_progress_bar_config(disable=True)
        assert isinstance(loaded.scheduler, DDIMScheduler)
        again = loaded(**get_dummy_inputs(SampleThenEvaluatePipeline))
        assert (again.best_adapter == expected.best_adapter).all() and again.certificate == expected.certificate
    assert isinstance(_pipeline().scheduler, DDPMScheduler)


def test_one_class_certified_on_several_support_sets():
    pipe = _pipeline()
    inputs = get_dummy_inputs(SampleThenEvaluatePipeline)
    calls = []

    def evaluate_fn(hypotheses):
        calls.append(hypotheses.shape)
        base = torch.sigmoid(hypotheses.mean(dim=1))
        return torch.stack([base, 1 - base, base.flip(0)])

    out = pipe(**{**inputs, "evaluate_fn": evaluate_fn, "output_type": "pt"})
    assert calls == [(8, 12)]
    assert out.best_adapter.shape == (3, 12) and out.risks.shape == (3, 8) and out.best_index.shape == (3,)
    for task in range(3):
        index = int(torch.argmin(out.risks[task]))
        assert int(out.best_index[task]) == index and torch.equal(out.best_adapter[task], out.hypotheses[index])
    expected = finite_class_certificate(out.empirical_risk, 20, 8, 0.05)
    assert torch.allclose(out.certificate, expected)


def test_digits_proxy_batched_logits_match_the_peft_model():
    import torch.nn.functional as F

    from diffusers_ext import ConvImageClassifier
    from diffusers_ext.data.digit_domains import DigitDomain, apply_domain
    from diffusers_ext.evaluation.certified_transfer import COSINE_SCALE, DigitsLoRAProxy

    torch.manual_seed(0)
    classifier = ConvImageClassifier(sample_size=8, block_out_channels=(8, 16), feature_dim=12, dropout=0.0).eval()
    images = torch.rand(30, 1, 8, 8) * 2 - 1
    labels = torch.arange(30) % 10
    proxy = DigitsLoRAProxy(classifier, images, labels)
    generator = torch.Generator().manual_seed(0)
    vectors = proxy.init_vectors(3, generator) + 0.1 * torch.randn(3, proxy.dim, generator=generator)
    shifted = apply_domain(images[:6], DigitDomain(rotation=20, shear=0.2, thickness=0.5, noise=0.1, inversion=1.0))
    classes = torch.tensor([1, 3, 5, 7, 9])
    logits = proxy.logits(vectors, proxy.trunk(shifted), classes)
    for i in range(3):
        proxy.vectorizer.load_into(proxy.peft_model, vectors[i])
        features = F.normalize(proxy.peft_model(shifted).features, dim=-1)
        expected = COSINE_SCALE * features @ proxy.prototypes[classes].T
        assert torch.allclose(logits[i], expected, atol=1e-5)
    # per-adapter inputs give the same logits as shared ones
    hidden = proxy.trunk(shifted)
    per = proxy.logits(vectors, hidden.expand(3, *hidden.shape), classes.expand(3, 5))
    assert torch.allclose(per, logits, atol=1e-5)


# the PAC-Bayes bound of SGD-fitted LoRA (the baseline's honest certificate) -----------------------------------


def test_isotropic_gaussian_kl_hand_values():
    from diffusers_ext.evaluation.certified_transfer import isotropic_gaussian_kl

    # d = 2, equal scales: ||mu_q - mu_p||^2 / (2 sigma^2) = 1 / (2 * 0.25) = 2
    assert float(isotropic_gaussian_kl(torch.tensor([1.0, 0.0]), torch.zeros(2), 0.5, 0.5)) == pytest.approx(2.0)
    # d = 1, same mean, sigma_q = 1, sigma_p = 2: 0.5 (1/4 - 1 + ln 4) = 0.3181472
    assert float(isotropic_gaussian_kl(torch.zeros(1), torch.zeros(1), 1.0, 2.0)) == pytest.approx(0.3181472, abs=1e-7)
    rows = isotropic_gaussian_kl(torch.tensor([[0.0, 0.0], [3.0, 4.0]]), torch.zeros(2), 1.0, 1.0)
    assert torch.allclose(rows, torch.tensor([0.0, 12.5], dtype=torch.float64))
    with pytest.raises(ValueError, match="sigma"):
        isotropic_gaussian_kl(torch.zeros(1), torch.zeros(1), 0.0, 1.0)


def test_pac_bayes_and_monte_carlo_bounds_hand_values():
    from diffusers_ext.evaluation.certified_transfer import monte_carlo_risk_bound, pac_bayes_bound
    from diffusers_ext.pipelines.certified_transfer.certificate import bernoulli_kl

    # r = 0.1, n = 100, KL = 10, delta = 0.05: budget (10 + ln 400) / 100 = 0.15991465; 0.1 + sqrt(budget / 2)
    budget = (10 + math.log(400)) / 100
    assert budget == pytest.approx(0.15991465, abs=1e-8)
    assert pac_bayes_bound(0.1, 100, 10.0) == pytest.approx(0.3827668, abs=1e-6)
    kl = pac_bayes_bound(0.1, 100, 10.0, kind="kl")
    assert float(bernoulli_kl(torch.tensor(0.1), torch.tensor(kl))) == pytest.approx(budget, abs=1e-9)
    assert 0.1 < kl < 0.3827668
    # tensors broadcast: one KL per task
    out = pac_bayes_bound(torch.tensor([0.1, 0.1]), 100, torch.tensor([10.0, 0.0]))
    assert out[0] == pytest.approx(0.3827668, abs=1e-6) and out[1] == pytest.approx(
        0.1 + math.sqrt(math.log(400) / 200)
    )
    # Monte Carlo: mean 0 over m draws -> 1 - delta^(1/m); m = 100, delta = 0.01 -> 0.0450074
    assert monte_carlo_risk_bound(0.0, 100, 0.01) == pytest.approx(1 - 0.01**0.01, abs=1e-9)
    assert monte_carlo_risk_bound(0.0, 100, 0.01) == pytest.approx(0.0450074, abs=1e-7)
    with pytest.raises(ValueError, match="kl"):
        pac_bayes_bound(0.1, 100, -1.0)
    with pytest.raises(ValueError, match="num_draws"):
        monte_carlo_risk_bound(0.1, 0, 0.01)


def _tiny_proxy():
    from diffusers_ext import ConvImageClassifier
    from diffusers_ext.evaluation.certified_transfer import DigitsLoRAProxy

    torch.manual_seed(0)
    classifier = ConvImageClassifier(sample_size=8, block_out_channels=(8, 16), feature_dim=12, dropout=0.0).eval()
    images = torch.rand(30, 1, 8, 8) * 2 - 1
    labels = torch.arange(30) % 10
    return DigitsLoRAProxy(classifier, images, labels), images, labels


def test_sgd_pac_bayes_bound_pays_for_the_prior_grid_and_the_monte_carlo_estimate():
    from diffusers_ext.evaluation.certified_transfer import (
        monte_carlo_risk_bound,
        pac_bayes_bound,
        sgd_pac_bayes_bound,
    )

    proxy, images, labels = _tiny_proxy()
    generator = torch.Generator().manual_seed(0)
    init = proxy.init_vectors(2, generator)
    hidden = proxy.trunk(images[:20]).reshape(2, 10, 16, 4, 4)
    targets = (labels[:20] % 5).reshape(2, 10)
    classes = torch.tensor([[0, 1, 2, 3, 4], [5, 6, 7, 8, 9]])
    sigmas = (0.01, 0.1)
    # an adapter that never moved from its initialisation: KL = 0, the bound is the confidence terms alone
    out = sgd_pac_bayes_bound(
        proxy, init, init, hidden, targets, classes, generator, prior_sigmas=sigmas, num_select_draws=4, num_draws=8
    )
    assert torch.equal(out["kl"], torch.zeros(2, dtype=torch.float64))
    gibbs = monte_carlo_risk_bound(out["gibbs_risk"], 8, 0.2 * 0.05)
    expected = pac_bayes_bound(gibbs, 10, torch.zeros(2), 0.8 * 0.05 / 2)
    assert torch.allclose(out["bound"], expected) and (out["bound"] > out["gibbs_risk"]).all()
    assert set(out["sigma"].tolist()) <= set(sigmas)
    assert out["posterior_draws"](3, torch.Generator().manual_seed(1)).shape == (2, 3, proxy.dim)
    # far from its prior at every scale of the grid: vacuous
    far = init + 5.0
    out = sgd_pac_bayes_bound(
        proxy, far, init, hidden, targets, classes, generator, prior_sigmas=sigmas, num_select_draws=4, num_draws=8
    )
    assert (out["bound"] > 1).all()
    with pytest.raises(ValueError, match="mc_delta_fraction"):
        sgd_pac_bayes_bound(proxy, init, init, hidden, targets, classes, generator, mc_delta_fraction=1.0)
