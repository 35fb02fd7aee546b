"""The death spiral as the paper describes it, looked for before it is compared: ``signature`` (the per-run
criterion, pure: logged series in, its three parts and their evidence out; its parameters are fixed in
docs/lab/spiral/signature.json before any calibration run) and the calibration's report (which parts of the
signature each exploratory setting showed)."""
