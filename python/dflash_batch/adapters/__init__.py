"""Adapters: how each training client drives a :class:`~dflash_batch.BucketSampler` and a
:class:`~dflash_batch.Loader` through its own public API and its own stateful protocols.

=========================  ====================================================================
client                     adapter
=========================  ====================================================================
HF ``Trainer``, TRL        :class:`dflash_batch.hf.BucketTrainer` (:mod:`.hf`)
accelerate                 :func:`.accelerate.batch_sampler` (prepared ``DataLoader``s, saved by
                           accelerate's stateful loaders); :func:`.accelerate.loader` (a ``Loader``
                           under ``accelerator.accumulate``)
Lightning                  a ``Loader`` as the train dataloader (Lightning saves it), or
                           :class:`.lightning.SamplerCheckpoint` beside ``DataLoader(batch_sampler=...)``
torch ``DataLoader``       :func:`.torch.loader` (torchdata's ``StatefulDataLoader`` over the store,
                           collated in Rust), or ``state_dict(step=...)``
=========================  ====================================================================

No adapter reads another library's private fields, walks stack frames or patches a client. Where a
client's public API cannot say what was trained, the adapter uses the client's own stateful protocol,
or the call refuses and says what to pass. Each submodule imports its client; this package imports none.
"""
