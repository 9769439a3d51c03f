"""runexp's compiler: gin experiment files in, a reviewable plan out, without TensorFlow.

Two layers live here (docs/LAYERS.md): the standard-library base (``errors``, ``exit_codes``,
``uris``, ``globs``, ``terminal``, and ``formats/``: the readers of the files runexp meets),
which every other module may import, and the plan layer (``specs/``, ``stages/``, the planner,
fingerprints, estimates, state, preflight), which may import the base and
``runexp.runtime.storage``. The commands (``cli``, ``diff``) sit above everything.
"""
