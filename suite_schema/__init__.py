"""The contract between the runtime that writes results (`experiments`, `hydra_plugins`) and the analysis that reads
them (`analysis`): the record layout (`layout`), how a config becomes a run id (`run_identity`) and which methods exist
(`registry`). Both sides import it; it imports neither, and nothing heavier than OmegaConf.
"""
