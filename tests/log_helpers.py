"""Reading what a training run logged."""


def tensorboard_tags(logdir) -> set[str]:
    """Every scalar tag in the TensorBoard event files under ``logdir``."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tags = set()
    for events in logdir.rglob("events.out.tfevents.*"):
        accumulator = EventAccumulator(str(events))
        accumulator.Reload()
        tags |= set(accumulator.Tags()["scalars"])
    return tags
