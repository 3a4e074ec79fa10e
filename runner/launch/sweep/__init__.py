"""A command's points, in one place: the pre-check of every point (:mod:`.precheck`, the axes from
:mod:`.overrides`), a grid of balanced plan-only points planned together first (:mod:`.plan_together`), the
sweep's parent run and outcome (:mod:`.parent`), its stop after failures (:mod:`.stop`), progress lines
(:mod:`.progress`), report and chart (:mod:`.sweep_report`, :mod:`.sweep_chart`), resume and reuse (:mod:`.resume`), a
searching sweeper's study (:mod:`.study`). What a run folder knows of its sweep is
:mod:`runner.track.sweep_points` (the track stage reads it too)."""
