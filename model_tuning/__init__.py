"""Tuning a model (``epilab.tune_model``, ``epilab tune --model``): its problems found by
compiling it, tuned by the kernel tuner, each template checked in the compiled model, the
model measured against Inductor. ``tune`` runs the steps; ``load`` makes the model and its
inputs, ``step`` what one call is (inference or a training step), ``variants`` the compiles
in each mode, ``in_context`` the check, ``interleave`` and ``significance`` the timing rounds
and the confidence rule, ``timing`` a call's time, ``report`` what the user reads. It sits
above both the compiler and the tuner."""
