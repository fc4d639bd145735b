#!/usr/bin/env python3
"""The seeds' API in a few lines: an AMPConfig, an AMPTrainer over ampkit.GradScaler, a loop.

  PYTHONPATH=build/python python3 tools/examples/seed_api_example.py [--precision bf16] [--steps 200]

Trains a small MLP on generated 4-class data on the CPU (CPU autocast) and prints the loss, the
loss scale and what the norm clipper did; under 30 s on a laptop core.
"""
import argparse

import torch

from ampkit.seeds import AMPTrainer, create_default_amp_config


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--precision", default="fp16", choices=["fp16", "bf16", "fp32"])
    parser.add_argument("--steps", type=int, default=200)
    args = parser.parse_args()

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.GELU(), torch.nn.Linear(64, 4))
    # fp16: dynamic loss scale; norm clipping at the plugin's per-precision max_norm; skip bad steps.
    config = create_default_amp_config(args.precision, nan_strategy="skip")
    trainer = AMPTrainer(model, config, optimizer=torch.optim.AdamW(model.parameters(), lr=3e-3))

    for step in range(args.steps):
        x = torch.randn(128, 16)
        y = x[:, :4].argmax(dim=1)  # the class is the largest of the first four inputs
        loss = trainer.training_step((x, y))
        if step % 20 == 0 or step == args.steps - 1:
            clip = trainer.last_clipping_stats
            print(f"step {step:4d}  loss {loss:.4f}  scale {trainer.scaler.get_scale():g}  "
                  f"grad_norm {clip['grad_norm']:.3f}  clipped {clip['clipped']}")
    summary = trainer.get_gradient_summary()
    print(f"steps taken {summary['steps_taken']}, skipped {summary['steps_skipped']}; "
          f"largest layer gradients: {[t['name'] for t in summary['top_layers'][:3]]}")


if __name__ == "__main__":
    main()
