"""The README's import path of the link-utilisation plot, kept for scripts that use it;
the plot lives in emulator/outputs/linkplot.py."""
from emulator.outputs.linkplot import plot_links

__all__ = ["plot_links"]
