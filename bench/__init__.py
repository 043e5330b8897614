"""Performance benchmarks (not tests): each script prints a table and writes a JSON result.

    python -m bench.train_step     # training step: ATLAS vs LoRA vs the frozen base
    python -m bench.decode         # generate() tokens/s: base, LoRA merged/unmerged, ATLAS hard/soft
    python -m bench.storage        # atlas + adapter bytes vs LoRA adapter bytes
    python -m bench.eval_cost      # retained-KL cost vs a plain forward; reference-cache reuse in a sweep
    bash bench/gpu.sh              # all four on a Qwen3-8B-shaped model in bf16 on one CUDA GPU

Results land in bench/results/<script>.json (`--out` to change); docs/performance.md quotes them.
"""
