"""Planning by stage kind: one module per kind, each planning and checking its stages.

The kinds themselves (spec, format version, whether they train) are declared in
compiler/kinds.py; the orchestration that chains them is compiler/planner.py, and
phases.py says which pretraining phases (train.phases) an experiment has.
"""
