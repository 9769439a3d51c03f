"""runexp's exit codes, defined once (the CLI, the executor and the relaunch loop use them).

Stable: scripts may branch on them. Standard library only.
"""

EXIT_OK = 0              # success (a dry run: nothing to do)
EXIT_USER_ERROR = 1      # bad gin, flags or input data; the message says file, line, what to do
EXIT_PENDING = 2         # a dry run found work to do (stages to create, rebuild or resume)
EXIT_STAGE_FAILED = 3    # a stage failed while running; finished stages are kept
# `runexp diff`: the two experiments differ (0: the same). Not diff(1)'s 1, our user error;
# not 2, "work pending", which a difference need not mean (compiler/diff.py).
EXIT_DIFFERENT = 4
# sysexits.h EX_TEMPFAIL ("temporary failure; the user is invited to retry"): SIGTERM stopped
# training after a checkpoint; the relaunch loop relaunches.
EXIT_PREEMPTED = 75
# GNU timeout's "the command timed out": the wall-time budget ran out after a checkpoint;
# not relaunched: run the same command again with a new budget.
EXIT_DEADLINE = 124
EXIT_INTERRUPTED = 130   # Ctrl-C (128 + SIGINT); finished stages are kept
