"""The group dashboard: a plain-data model, stock-widget views, the buttons' actions, the plot, a text fallback."""
