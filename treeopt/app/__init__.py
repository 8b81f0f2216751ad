"""The application layer: the only place that joins `calibration` (torch) and `roofline`
(numpy) over the core. The CLI and the `treeopt run` pipeline live here and in treeopt.cli;
nothing else imports them (docs/architecture.md)."""
