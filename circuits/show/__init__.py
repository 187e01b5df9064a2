"""Showing results: plotly figures, the self-contained HTML report, static export for papers.

* :mod:`circuits.show.patching_figures`: path patching maps, activation patching heatmaps,
  knockout and transfer curves (Zhang et al. 2024, Figures 2-4);
* :mod:`circuits.show.node_circuit`, :mod:`circuits.show.edge_figures`: the node circuit, the
  edge circuit graph and faithfulness curves;
* :mod:`circuits.show.explorer`: the interactive edge circuit (size control, hover, compare mode, paths to
  the logits) as one offline page, a report block or a notebook cell;
* :mod:`circuits.show.html_report`: one self-contained report.html per run;
* :mod:`circuits.show.static_export`: figures as SVG / PDF / PNG sized for a two-column paper.
"""
