"""The application on top of the library: the ``gymckpt`` command line (``cli``), ``serve``,
the offline snapshot tools (``snapshots``), the exactly-once verdict (``verdict``) with the
demo's toy trainer (``toy_trainer``), the crash/restore demo (``demo/``), the simulation
(``simulation/``), the built-in learners (``train/``) and ``chaos``. Nothing in the library
(runtime, gym_adapter, nurseries) imports it."""
