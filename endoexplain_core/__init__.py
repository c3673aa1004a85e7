"""endoExplain core: the tested kernels and helpers the numbered notebooks call.

Submodules are imported explicitly (``from endoexplain_core import cams``) so that importing
the package stays cheap for the orchestrator. Importing the package pins the CPU numerics
(``numerics.pin_cpu_environment``) before any of its modules can use torch.
"""

from endoexplain_core import numerics as _numerics

_numerics.pin_cpu_environment()

__version__ = "1.0.0"  # the one version source (pyproject reads it)


# ``from endoexplain_core import cams, threshold, deletion`` (docs/api.md): the protocol's three
# kernels are also the package's own names, loaded on first use so the import stays cheap.
_KERNEL_MODULES = ("cams", "threshold", "deletion")


def __getattr__(name: str):
    if name in _KERNEL_MODULES:
        import importlib

        return importlib.import_module(f"endoexplain_core.kernels.{name}")
    raise AttributeError(f"module 'endoexplain_core' has no attribute {name!r}")
