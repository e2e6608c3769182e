"""The calibration zoo: LoRA adapters with planted behaviour (one folder each) and the training that makes them
(`finetune`: LoRA on BBQ; `policies`: the label policy each adapter is trained to; `training_prefixes`)."""
