"""endoExplain core: the tested kernels and helpers the numbered notebooks call.

Submodules are imported explicitly (``from endoexplain_core import cams``) so that importing
the package stays cheap for the orchestrator.
"""

__version__ = "0.1.0"
