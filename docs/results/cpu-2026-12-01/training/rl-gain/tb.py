import sys, glob
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
for d in sys.argv[1:]:
    f = glob.glob(f"/tmp/kzl2/{d}/checkpoints/correctness/runs/*")[0]
    ea = EventAccumulator(f); ea.Reload()
    tags = ea.Tags()["scalars"]
    for tag in ["train/completions/mean_length", "train/completions/clipped_ratio", "train/entropy", "train/grad_norm", "train/frac_reward_zero_std", "train/reward"]:
        if tag in tags:
            print(d, tag.split('/',1)[1], [round(e.value, 2) for e in ea.Scalars(tag)])
