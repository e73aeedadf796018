"""Env families whose simulators need a Python environment of their own (a dependency our venv
cannot hold, e.g. LIBERO's robosuite 1.4): each simulator runs in a child process of the env
worker under the family's interpreter, behind the ``SubEnv`` contract (``child.ChildSubEnv``),
talking over the child's stdin and stdout (``codec``: JSON and raw arrays, never a pickle)."""
