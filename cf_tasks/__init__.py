"""cf-tasks: knowledge-conflict (counterfactual context) tasks for lm-evaluation-harness.

The package holds the logic that the dataset builders and the lm-eval task YAMLs share:
text normalisation, answer scoring, lm-eval hooks, the sweep scorer and the CLI.
"""

__version__ = "0.1.0"
