"""The exit codes of `python run.py` for one run (README, "What a run does"); a sweep launcher reads them back
from jobs whose entry point exited instead of returning."""

DONE = 0  # the run completed, or was complete already (skipped)
FAILED = 1  # the run failed; its record says why
BAD_CONFIG = 2  # the config asks for something impossible; nothing ran
RUN_BUSY = 3  # another launch is running this run
INTERRUPTED = 4  # a signal (SIGTERM, SIGINT, SIGUSR2) stopped the run, recorded `interrupted`; the same command resumes
