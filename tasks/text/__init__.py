"""Text tasks: AG News (or a synthetic four-topic corpus) with a BERT-style encoder split into a frozen
lower part, trained top layers + pooling (the extractor) and a classifier head; plug-ins sit on the pooled
sentence representation. See ``tasks.text.task`` and docs/text.md."""
