"""The notebook layer: magics, output in cells, and the dashboard; it calls one public method per action."""
