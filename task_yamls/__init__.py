"""The lm-eval task YAMLs. A regular package, so that the ``lm_eval.tasks`` entry point's value
(``task_yamls``) resolves to this one folder: lm-eval's proposed entry-point discovery (PR #4015)
scans the folder of the package the entry point names."""
