"""The search engine: per item, the prompt mutation that pushes the target furthest toward the objective's answer
within a query budget.

- `state.py`: what one item's search holds (budget, best, families) and what every method is given (SearchContext);
- `methods/`: one file per search method, each registered by name (`SEARCH_METHODS`);
- `loop.py`: the driver that runs many items at once, so one forward batch mixes prompts of several items;
- `learner.py`: the run-level learner (what each template, operator and composition has gained on this model);
- `families.py`: the attack families, each one's hardest prompt per item, and the run's archive of successes;
- `distributed.py`: the same search spread over Ray workers.
"""
