"""Fine-tune with a Transformers Trainer in Ray Train's style: TorchTrainer + a train_func that builds a
``transformers.Trainer``, ``prepare_trainer`` and ``RayTrainReportCallback`` (a tiny BERT built from a
config, token ids generated in place: nothing is downloaded).

Written for Ray Train (``ray.train``); runs on raytrain_nb after changing only the imports.
"""
import os
import tempfile

import ray.train as train
import torch
from ray.train import RunConfig, ScalingConfig
from ray.train.huggingface.transformers import RayTrainReportCallback, prepare_trainer
from ray.train.torch import TorchTrainer
from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments

SEQ_LEN, VOCAB = 16, 100


class TokenDataset(torch.utils.data.Dataset):
    """Random token ids; the label is whether the first token is even."""

    def __init__(self, n, seed):
        g = torch.Generator().manual_seed(seed)
        self.input_ids = torch.randint(0, VOCAB, (n, SEQ_LEN), generator=g)
        self.labels = (self.input_ids[:, 0] % 2 == 0).long()

    def __len__(self):
        return len(self.input_ids)

    def __getitem__(self, i):
        return {"input_ids": self.input_ids[i], "attention_mask": torch.ones(SEQ_LEN, dtype=torch.long),
                "labels": self.labels[i]}


def train_func(config):
    torch.manual_seed(0)
    model_config = BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                              intermediate_size=64, max_position_embeddings=SEQ_LEN, num_labels=2)
    model = BertForSequenceClassification(model_config)

    # Hugging Face Trainer
    training_args = TrainingArguments(
        output_dir=config["output_dir"],
        per_device_train_batch_size=8,
        per_device_eval_batch_size=8,
        max_steps=config["max_steps"],
        logging_steps=2,
        eval_strategy="steps",
        eval_steps=config["save_steps"],
        save_strategy="steps",
        save_steps=config["save_steps"],
        learning_rate=1e-3,
        report_to="none",
        disable_tqdm=True,
    )
    trainer = Trainer(
        model=model,
        args=training_args,
        train_dataset=TokenDataset(64, seed=1),
        eval_dataset=TokenDataset(16, seed=2),
    )

    # Report metrics and checkpoints to Ray Train
    callback = RayTrainReportCallback()
    trainer.add_callback(callback)

    # Prepare the Trainer for Ray Train
    trainer = prepare_trainer(trainer)

    # Resume from the newest checkpoint after a restart
    checkpoint = train.get_checkpoint()
    if checkpoint:
        with checkpoint.as_directory() as checkpoint_dir:
            checkpoint_path = os.path.join(checkpoint_dir, RayTrainReportCallback.CHECKPOINT_NAME)
            trainer.train(resume_from_checkpoint=checkpoint_path)
    else:
        trainer.train()


if __name__ == "__main__":
    trainer = TorchTrainer(
        train_func,
        train_loop_config={"output_dir": tempfile.mkdtemp(prefix="hf-"), "max_steps": 8, "save_steps": 4},
        scaling_config=ScalingConfig(num_workers=2, use_gpu=False),
        run_config=RunConfig(name=f"transformers-{os.getpid()}"),
    )
    result = trainer.fit()
    print(f"Trainer metrics: {result.metrics}")
    assert result.metrics["step"] == 8 and "eval_loss" in result.metrics and "train_loss" in result.metrics
    with result.checkpoint.as_directory() as checkpoint_dir:
        files = sorted(os.listdir(os.path.join(checkpoint_dir, RayTrainReportCallback.CHECKPOINT_NAME)))
    print(f"checkpoint files: {files}")
    assert "model.safetensors" in files and {"rng_state_0.pth", "rng_state_1.pth"} <= set(files)
    print("TRANSFORMERS OK")
