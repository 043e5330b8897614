"""Hydra launchers of the ATLAS suite: re-runnable sweeps, locally and on SLURM (experiments/sweep.py)."""
