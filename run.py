"""Entry point: compose the config with Hydra and hand it to `experiments.job.run`.

    python run.py                                        # ATLAS-suite default on the micro benchmark
    python run.py -m method=atlas,lora backbone=qwen3-8b seed=0,1,2
"""

import sys

import hydra
from omegaconf import DictConfig

from experiments.run_id import register_run_id_resolver

register_run_id_resolver()


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def main(cfg: DictConfig) -> None:
    # here, not at the top: `python run.py --help` and `--cfg job` stay fast without the runtime (torch)
    from experiments import exit_codes
    from experiments.closed_output import say
    from experiments.job import USER_ERRORS, discard_rejected_run_dir, run
    from experiments.run_dir import RunDirError
    from experiments.run_lock import RunBusyError, RunLockError
    from experiments.signals import SignalInterrupt
    from experiments.train import Diverged, Preempted

    try:
        run(cfg)
    except USER_ERRORS as exc:
        say(f"error: {exc}")
        if not isinstance(exc, RunDirError):  # a folder not the run's own is left as it is
            discard_rejected_run_dir()
        sys.exit(exit_codes.BAD_CONFIG)
    except Diverged as exc:  # recorded `failed` in phase train; its traceback says nothing more
        say(f"failed: {exc}")
        sys.exit(exit_codes.FAILED)
    except RunBusyError as exc:
        say(f"error: {exc}")
        sys.exit(exit_codes.RUN_BUSY)
    except RunLockError as exc:
        say(f"error: {exc}")
        sys.exit(exit_codes.FAILED)
    except (Preempted, KeyboardInterrupt, SignalInterrupt) as exc:  # recorded `interrupted`; the same command resumes
        say(f"interrupted: {exc or 'SIGINT (Ctrl-C)'}; the same command resumes the run")
        sys.exit(exit_codes.INTERRUPTED)


if __name__ == "__main__":
    from experiments import command_line
    from experiments.closed_output import flush_quietly
    from experiments.log import quiet_console

    quiet_console()  # `python run.py | head`: the run goes on to its record when its output closes
    sys.argv[1:] = command_line.normalized(sys.argv[1:])  # `+experiment=NAME`, the old spelling, still selects it
    try:
        if "--plan" in sys.argv[1:]:  # what a launch would do, nothing run
            from hydra_plugins.atlas_sweep.plan_command import main as plan

            sys.exit(plan([a for a in sys.argv[1:] if a != "--plan"]))
        if {"--help", "-h"} & set(sys.argv[1:]):
            print(command_line.help_text())
            sys.exit(0)
        if "--cfg" in sys.argv[1:] or "-c" in sys.argv[1:]:  # the composed config, validated as a run validates it
            from experiments.validation import ConfigError

            try:
                command_line.show_config(sys.argv[1:])
            except ConfigError as exc:
                print(f"error: {exc}", file=sys.stderr)
                sys.exit(2)
            sys.exit(0)
        command_line.exit_on_error(sys.argv[1:])  # a bad override: one line and exit 2, before Hydra acts on it
        main()
    finally:
        flush_quietly()  # an output closed since the last write: Python's flush at exit must not fail the run
