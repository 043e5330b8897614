"""Analysis of result records: collect runs into a table, Pareto frontiers, KL at a matched coding
requirement with paired comparisons over seeds, paper tables and figures, and a reproducible report.

Reads result files only (`record.json` per run, or W&B runs); imports nothing from the training
packages. Command line: `python -m analysis collect ...` and `python -m analysis report ...`.
"""
