"""endoExplain core: the tested kernels and helpers the numbered notebooks call.

Submodules are imported explicitly (``from endoexplain_core import cams``) so that importing
the package stays cheap for the orchestrator. Importing the package pins the CPU numerics
(``numerics.pin_cpu_environment``) before any of its modules can use torch.
"""

from endoexplain_core import numerics as _numerics

_numerics.pin_cpu_environment()

__version__ = "0.1.0"
