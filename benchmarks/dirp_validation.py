#!/usr/bin/env python
"""Choose DIRP's learning rate, iterations and perceptual budget on a validation class before the benchmark.

    python benchmarks/dirp_validation.py > benchmarks/results/dirp-validation.txt

32 digits of class 5 (the benchmark, `benchmarks/dirp.py`, measures class 3), AdvDM and PhotoGuard at 8/255 and
16/255 (100 PGD steps of 1/255), five settings of DIRP (5-step inversion at strength 0.5) beside the protected images
and IMPRESS. The benchmark's defaults (lr 0.003, 80 iterations, SSIM budget 0.02) were picked from this output: the
best PSNR to clean over both budgets.
"""

import torch

from diffusers_ext import DIRPPipeline, zoo
from diffusers_ext.data.digits import load_digits_images
from diffusers_ext.evaluation.dirp import purifiers
from diffusers_ext.evaluation.dirp.protections import protect
from diffusers_ext.metrics import peak_signal_noise_ratio


SETTINGS = [(0.01, 40, "ssim", 0.05), (0.003, 40, "ssim", 0.05), (0.01, 40, "ssim", 0.02), (0.01, 40, "l2", 0.03),
            (0.003, 80, "ssim", 0.02)]  # fmt: skip


def main():
    torch.set_num_threads(1)
    pipe = DIRPPipeline.from_pretrained(zoo.path("digits-ddpm"))
    pipe.set_progress_bar_config(disable=True)
    images, labels = load_digits_images("all", resolution=8)
    clean = images[labels == 5][:32]

    def psnr(x):
        return float(peak_signal_noise_ratio(x, clean, data_range=2.0).mean())

    for budget in (8, 16):
        for method in ("advdm", "photoguard"):
            protected = protect(pipe, clean, method, eps=budget / 255, num_steps=100, step_size=1 / 255,
                                generator=torch.Generator().manual_seed(0))  # fmt: skip
            impress = purifiers.impress(pipe, protected, num_iterations=40, learning_rate=0.01, perceptual_budget=0.05)
            print(budget, method, f"prot {psnr(protected):.2f} impress {psnr(impress):.2f}", flush=True)
            for lr, iterations, perceptual, hinge in SETTINGS:
                out = pipe(protected, num_inversion_steps=5, inversion_strength=0.5, num_iterations=iterations,
                           learning_rate=lr, perceptual=perceptual, perceptual_budget=hinge, output_type="pt",
                           gradient_checkpointing=False)  # fmt: skip
                print("   ", lr, iterations, perceptual, hinge, f"dirp {psnr(out.images * 2 - 1):.2f}",
                      f"rec {float(out.recon_error_after.mean()):.4f}", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
