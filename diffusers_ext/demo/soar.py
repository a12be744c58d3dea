"""Demo section: SOAR decoding of the zoo masked diffusion LM, against greedy and Fast-dLLM threshold decoding."""

import time
from dataclasses import dataclass

from .plots import save_bar_plot
from .report import Figure, Section


@dataclass(frozen=True)
class SOARDemoSettings:
    num_problems: int


SETTINGS = {
    "quick": SOARDemoSettings(num_problems=100),
    "default": SOARDemoSettings(num_problems=300),
    "full": SOARDemoSettings(num_problems=500),
}

DECODERS = {
    "greedy (8 steps)": {},
    "threshold 0.9": {"confidence_threshold": 0.9},
    "SOAR 0.9, beam 2": {"confidence_threshold": 0.9, "max_beam_size": 2},
}


def soar_section(output_dir: str, mode: str, seed: int, device: str) -> Section:
    """Decode addition test problems with each decoder; plot exact match and forward calls."""

    from .. import zoo
    from ..data.addition import AdditionTokens, draw_test_problems
    from ..schedulers.scheduling_soar import SOARScheduler

    settings = SETTINGS[mode]
    pipe = zoo.load("addition-mdm").to(device)
    pipe.set_progress_bar_config(disable=True)
    encoder = AdditionTokens(pipe.tokenizer, num_digits=3)
    pairs = draw_test_problems(settings.num_problems, num_digits=3, seed=seed)
    prompts, answers = encoder.prompts(pairs).to(device), encoder.answers(pairs).to(device)
    rows, texts = [], {}
    for name, config in DECODERS.items():
        pipe.scheduler = SOARScheduler(block_length=encoder.gen_length, **config)
        start = time.perf_counter()
        out = pipe(input_ids=prompts, gen_length=encoder.gen_length, eos_early_stop=False, output_type="text")
        seconds = time.perf_counter() - start
        correct = (out.sequences == answers).all(1).float()
        rows.append(
            {
                "decoder": name,
                "exact match": correct.mean().item(),
                "NFE per prompt": out.nfe.float().mean().item(),
                "row forwards per prompt": out.row_forwards.float().mean().item(),
                "seconds": seconds,
            }
        )
        texts[name] = out.texts
    save_bar_plot(
        {r["decoder"]: r["exact match"] for r in rows},
        f"{output_dir}/soar_accuracy.png",
        "Exact match on addition test problems",
        "exact match",
    )
    save_bar_plot(
        {r["decoder"]: r["NFE per prompt"] for r in rows},
        f"{output_dir}/soar_nfe.png",
        "Model forward calls per prompt",
        "NFE",
    )
    examples = [
        f"{int(a):03d}+{int(b):03d}= -> " + ", ".join(f"{name}: {texts[name][i]!r}" for name in DECODERS)
        for i, (a, b) in enumerate(pairs[:3].tolist())
    ]
    greedy, soar = rows[0], rows[-1]
    return Section(
        title="SOAR: search or accelerate, for masked diffusion LMs",
        summary=(
            f"The zoo masked diffusion LM (3-digit addition, answer most-significant digit first) decoded "
            f"{settings.num_problems} test problems. Greedy low-confidence remasking, one token per step: "
            f"{greedy['exact match']:.1%} exact match at {greedy['NFE per prompt']:.2f} forward calls per prompt. "
            f"SOAR (commit every position above 0.9 at once, else a beam of 2 over which position to commit): "
            f"{soar['exact match']:.1%} at {soar['NFE per prompt']:.2f} forward calls. {settings.num_problems} "
            "problems are a small sample: benchmarks/soar/results/soar.md compares the decoders on 5000."
        ),
        figures=[
            Figure("soar_accuracy.png", "Exact match of the decoded answers."),
            Figure("soar_nfe.png", "Model forward calls per prompt (all beams share one batched call)."),
        ],
        table=rows,
        notes=[
            *examples,
            f"seed {seed}; the full comparison (more decoders, oracle chains): python benchmarks/soar/soar.py",
        ],
    )
