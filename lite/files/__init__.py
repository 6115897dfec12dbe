"""The file and text side: the GGUF file and its config, the tokenizer and chat template, the hub
that fetches files, `lite info` and the synthetic files of `lite synth`."""
