"""The cost model's room: what a plan is expected to cost on this hardware, and how that expectation is measured,
trusted, fitted and corrected.

- :mod:`.calibration`: a calibration as a versioned file (fingerprint, constants, spread, measurements), read and
  checked value by value; :mod:`.choice`: which calibration (or TorchRec's constants) a job plans with.
- :mod:`.trust`: each part's trust from its repeats, each constant checked, what an untrusted part falls back to.
- :mod:`.fit`: the fit of the constants from raw measurements (``fixed + size / rate`` per part), and
  ``mode=calibrate``'s file, report and metrics from its workers' measurements.
- :mod:`.topology`: TorchRec's ``Topology`` with the knobs a calibration sets (bandwidths per collective, kernels).
- :mod:`.step_estimate`: the whole step per rank: TorchRec's embedding estimate plus the terms it lacks.
- :mod:`.learn`: learning from runs (the step overhead refitted from finished runs); :mod:`.torchrec_export`: a
  calibration in TorchRec's own terms.

Adding a term to the step model touches :mod:`.step_estimate` (and, when it is measured, :mod:`.fit` and the
measurement in :mod:`runner.train.calibrate`) and ``tests/plan/test_calibration.py``. Private to
:mod:`runner.plan`: the rest of the runner uses what :mod:`runner.plan`'s door names.
"""
