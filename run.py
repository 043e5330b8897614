"""Entry point: compose the config with Hydra and hand it to `experiments.job.run`.

    python run.py                                        # ATLAS-suite default on the micro benchmark
    python run.py -m method=atlas,lora backbone=qwen3-8b seed=0,1,2
"""

import sys

import hydra
from omegaconf import DictConfig, OmegaConf


def _run_id(*, _root_: DictConfig) -> str:
    from experiments.job import run_id_for

    science = OmegaConf.masked_copy(_root_, [k for k in _root_ if k != "hydra"])
    return run_id_for(science)


OmegaConf.register_new_resolver("run_id", _run_id, use_cache=False, replace=True)


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def main(cfg: DictConfig) -> None:
    from experiments.job import USER_ERRORS, run

    try:
        run(cfg)
    except USER_ERRORS as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
