# The seed's mixture-of-experts layer, complete. Lines up to the loop over top_k are the
# seed's own; the seed leaves the expert step as a comment ("here could be your
# optimization: grouping tokens by expert..."), and this file writes it out.
# Each expert is two matrices with a GELU between: expert_weights = [w_in, w_out], with
# w_in of shape [num_experts, hidden, ffn] and w_out of shape [num_experts, ffn, hidden].
import torch
from kf import cuda_kernel


@cuda_kernel
def moe_layer_fused(x, gate_weights, expert_weights, top_k=2):
    # x: [batch, seq, hidden]
    # gate_weights: [num_experts, hidden]
    # expert_weights: список весов экспертов

    batch, seq, hidden = x.shape
    num_experts = gate_weights.shape[0]

    # Вычисляем логиты гейта
    gate_logits = torch.matmul(x, gate_weights.t())  # [batch, seq, num_experts]

    # Top-k экспертов для каждого токена
    topk_values, topk_indices = torch.topk(gate_logits, k=top_k, dim=-1)

    # Softmax по выбранным экспертам
    topk_weights = torch.softmax(topk_values, dim=-1)

    # Веса, с которыми каждый токен идёт к каждому эксперту: [batch, seq, num_experts]
    experts = torch.arange(num_experts, device=x.device)
    combine = torch.zeros(batch, seq, num_experts, dtype=x.dtype, device=x.device)
    for k in range(top_k):
        expert_idx = topk_indices[..., k]
        weight = topk_weights[..., k]
        routed = (expert_idx.unsqueeze(-1) == experts).to(x.dtype)
        combine = combine + routed * weight.unsqueeze(-1)

    # Применяем экспертов: GELU(x @ w_in[e]) @ w_out[e], взвешенно по combine
    w_in, w_out = expert_weights
    output = torch.zeros_like(x)
    for e in range(num_experts):
        h = torch.nn.functional.gelu(torch.matmul(x, w_in[e]))
        output = output + combine[..., e:e + 1] * torch.matmul(h, w_out[e])

    return output
