"""The torch runtime helpers an exported module defines: functions some translations call
(by name, through ``TorchContext.helper``) where torch has no single call of the same meaning.
Each is written into the module only when one of its translations is used."""

HELPERS = {
    "one_hot": '''
def one_hot(idx, depth, dtype=torch.float32, ignore_index=None):
    """[..., 1] integer indices -> [..., depth]: 1 at the index, 0 elsewhere (an index outside
    0..depth-1, or equal to ignore_index, gives a zero row, as in tensorgrad)."""
    hot = idx == torch.arange(depth, device=idx.device)
    return (hot if ignore_index is None else hot & (idx != ignore_index)).to(dtype)
''',
    "embedding": '''
def embedding(table, idx):
    """Rows of table [V, D] picked by integer idx [...] -> [..., D]; an index outside 0..V-1
    gives a zero row (and no gradient), as in tensorgrad."""
    vocab = table.shape[0]
    valid = ((idx >= 0) & (idx < vocab)).unsqueeze(-1).to(table.dtype)
    return F.embedding(idx.clamp(0, vocab - 1), table) * valid
''',
    "softmax_causal": '''
def softmax_causal(scores):
    """Softmax of row q over columns 0..q of [..., T, T] scores; later columns are 0."""
    t = scores.shape[-1]
    future = torch.ones(t, t, dtype=torch.bool, device=scores.device).triu(1)
    return scores.masked_fill(future, float("-inf")).softmax(-1)
''',
    "where_causal": '''
def where_causal(x, fill):
    """x [..., T, T] with the entries above the diagonal (column > row) set to fill."""
    t = x.shape[-1]
    future = torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1)
    return x.masked_fill(future, fill)
''',
    "normalize_last": '''
def normalize_last(x, eps, center):
    """(x - mean) / sqrt(var + eps) over the last axis (biased variance), or, without
    centering, x / sqrt(mean(x²) + eps)."""
    if center:
        return F.layer_norm(x, x.shape[-1:], eps=eps)
    return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps)
''',
    "sum_to_shape": '''
def sum_to_shape(x, shape):
    """Sum x down to `shape`, undoing a broadcast (leading axes, then size-1 axes)."""
    lead = x.dim() - len(shape)
    if lead:
        x = x.sum(dim=tuple(range(lead)))
    ones = tuple(k for k, n in enumerate(shape) if n == 1 and x.shape[k] != 1)
    return x.sum(dim=ones, keepdim=True) if ones else x
''',
    "categorical": '''
def categorical(logits):
    """One sample per row of the last axis, probabilities softmax(logits) (Gumbel-max)."""
    u = torch.rand_like(logits).clamp_min(1e-10)
    return (logits - torch.log(-torch.log(u))).argmax(-1)
''',
    "max_pool2d_padded": '''
def max_pool2d_padded(x, kernel, stride, padding):
    """Max pooling whose padding may exceed half the kernel (padded cells never win)."""
    ph, pw = padding
    x = F.pad(x, (pw, pw, ph, ph), value=float("-inf"))
    return F.max_pool2d(x, kernel, stride)
''',
}
