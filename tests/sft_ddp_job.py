"""One SFT run for tests/test_distributed.py: `python sft_ddp_job.py WORK BATCH OUT [STEPS [SAVE_STEPS [KILL_AT]]]`, plain or
under `accelerate launch`; with KILL_AT every process ends (exit 0, as if killed) right after the checkpoint of that step.

Every file the run dir gets through `atomic_write_json` (the SFT module's and the core's) or `save_pretrained` is logged as `<rank> <path>` in
`OUT.writes`, so the test can check that no two processes wrote one file."""
import json, os, sys
from pathlib import Path

import transformers
from datasets import Dataset

import coa_lib.core as core
import coa_lib.sft as sft
from coa_lib.core import close_process_group

work, batch, out = Path(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3])
steps, save_steps = (int(sys.argv[4]) if len(sys.argv) > 4 else 4), (int(sys.argv[5]) if len(sys.argv) > 5 else 1000)
kill_at = int(sys.argv[6]) if len(sys.argv) > 6 else None
rank = os.environ.get("RANK", "0")

class KilledAfterCheckpoint(transformers.TrainerCallback):
    "The process ends right after the checkpoint of step `kill_at` is written (a kill between steps)."
    def on_save(self, args, state, control, **kwargs):
        if state.global_step == kill_at: os._exit(0)

def logged(fn, path_of):
    "`fn`, logging the path it writes."
    def wrapper(*args, **kwargs):
        with open(f"{out}.writes", "a") as log: log.write(f"{rank} {path_of(args, kwargs)}\n")
        return fn(*args, **kwargs)
    return wrapper

sft.atomic_write_json = logged(sft.atomic_write_json, lambda a, k: a[0])
core.atomic_write_json = logged(core.atomic_write_json, lambda a, k: a[0])     # the model's marker and building.json
transformers.PreTrainedModel.save_pretrained = logged(transformers.PreTrainedModel.save_pretrained, lambda a, k: f"{a[1]}/model")

rows = Dataset.from_list(json.loads((work / "rows.json").read_text()))
cfg = sft.SFTStageConfig(batch_size=batch, max_steps=steps, lr=1e-3, warmup_steps=0, lr_schedule="constant", logging_steps=1,
                         save_steps=save_steps, group_by_length=False, bf16=False, threads=1, seed=0)
sft.train_sft(rows, str(work / "init"), out, cfg, callbacks=[KilledAfterCheckpoint()] if kill_at else None)
close_process_group()   # as `python -m coa_lib.stages` does: no gloo thread outlives the interpreter
