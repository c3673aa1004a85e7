"""One function per notebook section: each computes its section's tables and figures through the
analysis and figures layers and returns a ``presentation.Section`` (what is saved, what a reader
sees, the finding in words). A notebook cell is then one call and ``presentation.report``.

Sections layer: above analysis and figures, below the pipeline (docs/architecture.md, "Layers").
"""
