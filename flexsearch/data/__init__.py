"""What a prompt is made of: the items (`items`: BBQ, FLEX and split loaders; `seed`: the packaged seed set), a
candidate prompt with its edit provenance (`candidate`), its text (`render`) and the label-validity rules that
text must keep (`audit`)."""
