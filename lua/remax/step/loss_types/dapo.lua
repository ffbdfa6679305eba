-- remax.step.loss_types.dapo: TRL's loss_type = "dapo" (TRL's default; Yu et al., 2025): the
-- clipped surrogate, token sum / loss tokens of the whole step (TRL's num_items_in_batch).
return {
  name = "dapo", rank = 4,
  aggregation = "token-mean",
  normalisation = "token sum / tokens of the whole step (num_items_in_batch)",
}
