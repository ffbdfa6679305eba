-- remax.step.loss_types.bnpo: TRL's loss_type = "bnpo": the clipped surrogate, token sum over the
-- micro-batch's loss tokens, mean over micro-batches ("micro-token-mean": TRL normalises by the
-- local batch's tokens, so results depend on the micro-batch size).
return {
  name = "bnpo", rank = 2,
  aggregation = "micro-token-mean",
  normalisation = "token sum / tokens of the micro-batch, mean over micro-batches",
}
