"""The stages of `treeopt run`, one module each, in the order the main job runs them
(docs/architecture.md#the-main-job): calibrate -> proposal -> hardware -> predict -> sweep
-> select (with the drafter's own forms, `forms`) -> validate. Each takes the run's `Job` and
the results of the stages before it and returns a small frozen result; `treeopt.app.run`
keeps the sequence and the record of stages done (`run_state.json`)."""
