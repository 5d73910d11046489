//! Which path computes a network's passes: the hand-written CPU one ([`CpuNetwork`]) where the
//! network allows it, else candle's ops and autograd (every device). This is the one place that
//! knows both: training steps, evaluation and decoding ask a [`Forward`] and never match on it.

use candle_core::Tensor;

use super::fast::{CpuDecode, CpuNetwork, Workspace};
use super::linear::HostGrads;
use super::linear::LowRank;
use super::packing::Packing;
use super::san::decode::{pick, DecodeState};
use super::{Network, Result};

/// How passes are computed.
#[derive(Debug)]
pub enum Forward {
    Cpu(CpuNetwork, Box<Workspace>),
    Candle(Network),
}

/// A decoding run's state, on the path that computes it.
#[derive(Debug, Clone)]
pub(super) enum Decoding {
    Cpu(CpuDecode),
    Candle(DecodeState),
}

impl Decoding {
    /// Every token so far, prompt included.
    pub(super) fn history(&self) -> &[u32] {
        match self {
            Decoding::Cpu(state) => state.history(),
            Decoding::Candle(state) => &state.history,
        }
    }
}

impl Forward {
    /// The hand-written path where `network` allows it, else candle's.
    pub fn new(network: Network) -> Result<Self> {
        Ok(match CpuNetwork::supports(&network) {
            true => Forward::Cpu(CpuNetwork::new(&network)?, Box::default()),
            false => Forward::Candle(network),
        })
    }

    /// Candle's ops and autograd even on the CPU (what CUDA and Metal run), or (`false`) the path
    /// [`Forward::new`] picks.
    pub fn with_autograd(network: Network, autograd: bool) -> Result<Self> {
        if autograd {
            return Ok(Forward::Candle(network));
        }
        Self::new(network)
    }

    pub fn network(&self) -> &Network {
        match self {
            Forward::Cpu(cpu, _) => cpu.network(),
            Forward::Candle(network) => network,
        }
    }

    /// Whether passes run the hand-written CPU path.
    pub fn hand_written(&self) -> bool {
        matches!(self, Forward::Cpu(..))
    }

    /// `(Σ ce·mask, Σ mask)` summed over `passes`, without gradients.
    pub fn masked_ce_sum(&mut self, passes: &[Packing], low_rank: Option<&LowRank>) -> Result<(f64, f64)> {
        let (mut sum, mut count) = (0f64, 0f64);
        match self {
            Forward::Cpu(cpu, workspace) => {
                let factors = cpu.factors(low_rank)?;
                for packing in passes {
                    let (part, weight) = cpu.masked_ce_sum(packing, &factors, workspace)?;
                    sum += part;
                    count += weight;
                }
            }
            Forward::Candle(network) => {
                for packing in passes {
                    let (part, weight) = network.masked_ce_sum(packing, low_rank)?;
                    sum += f64::from(part.to_scalar::<f32>()?);
                    count += weight;
                }
            }
        }
        Ok((sum, count))
    }

    /// `Σ ce·mask / normalizer` summed over `passes` and the gradients of the factors of
    /// `low_rank`, summed on the host by kernel path and layer. With `recompute`, each layer's
    /// internals are recomputed in the backward instead of kept.
    pub fn loss_and_grads(
        &mut self,
        passes: &[Packing],
        low_rank: &LowRank,
        normalizer: f64,
        recompute: bool,
    ) -> Result<(f32, HostGrads)> {
        let mut grads = HostGrads::new();
        let mut loss = 0f32;
        match self {
            Forward::Cpu(cpu, workspace) => {
                let factors = cpu.factors(Some(low_rank))?;
                for packing in passes {
                    loss += cpu.loss_and_grads(packing, &factors, normalizer, recompute, workspace, &mut grads)?;
                }
            }
            Forward::Candle(network) => {
                for packing in passes {
                    let (part, store) = if recompute {
                        network.loss_and_grads_by_layer(packing, low_rank, normalizer)?
                    } else {
                        let part = (network.masked_ce_sum(packing, Some(low_rank))?.0 / normalizer)?;
                        (part.to_scalar()?, part.backward()?)
                    };
                    for (key, (a, b)) in low_rank.entries() {
                        let host = |t: &Tensor| -> Result<Option<Vec<f32>>> {
                            Ok(store.get(t).map(|g| g.flatten_all()?.to_vec1()).transpose()?)
                        };
                        let (ga, gb) = match (host(a)?, host(b)?) {
                            (None, None) => continue,
                            (ga, gb) => (
                                ga.unwrap_or_else(|| vec![0.0; a.elem_count()]),
                                gb.unwrap_or_else(|| vec![0.0; b.elem_count()]),
                            ),
                        };
                        add_factor_grads(&mut grads, key, ga, gb);
                    }
                    loss += part;
                }
            }
        }
        Ok((loss, grads))
    }

    /// A decoding state that has seen nothing.
    pub(super) fn decode_state(&self) -> Result<Decoding> {
        Ok(match self {
            Forward::Cpu(cpu, _) => Decoding::Cpu(cpu.decode_state()),
            Forward::Candle(network) => Decoding::Candle(network.decode_state()?),
        })
    }

    /// Runs `new[b]` tokens after those `states[b]` has seen, for every run `b` together on the
    /// CPU path (candle's runs them one after another); each run's most likely next token and its
    /// probability.
    pub(super) fn decode_steps(&mut self, new: &[&[u32]], states: &mut [&mut Decoding]) -> Result<Vec<(u32, f32)>> {
        if let Forward::Cpu(cpu, workspace) = self {
            let mut cpu_states: Vec<&mut CpuDecode> = states
                .iter_mut()
                .filter_map(|state| match &mut **state {
                    Decoding::Cpu(state) => Some(state),
                    Decoding::Candle(_) => None,
                })
                .collect();
            if cpu_states.len() == new.len() {
                return Ok(cpu.decode_steps(new, &mut cpu_states, workspace)?.iter().map(|l| pick(l)).collect());
            }
        }
        new.iter().zip(states).map(|(new, state)| self.decode_step(new, state)).collect()
    }

    /// Runs `new` tokens after those `state` has seen; the most likely next token and its probability.
    pub(super) fn decode_step(&mut self, new: &[u32], state: &mut Decoding) -> Result<(u32, f32)> {
        match (self, state) {
            (Forward::Cpu(cpu, workspace), Decoding::Cpu(state)) => {
                Ok(pick(&cpu.decode_steps(&[new], &mut [state], workspace)?.remove(0)))
            }
            (Forward::Candle(network), Decoding::Candle(state)) => {
                let logits = network.decode_step(new, state)?.to_dtype(candle_core::DType::F32)?;
                Ok(pick(&logits.to_vec1()?))
            }
            (forward, state) => {
                // A state made by the other path: start over on this one from its tokens.
                let history = state.history().to_vec();
                *state = forward.decode_state()?;
                forward.decode_step(&[history.as_slice(), new].concat(), state)
            }
        }
    }
}

/// Adds one factor's gradients `(dA, dB)` to `grads`.
fn add_factor_grads(grads: &mut HostGrads, key: &(String, usize), ga: Vec<f32>, gb: Vec<f32>) {
    match grads.get_mut(key) {
        Some((a, b)) => {
            a.iter_mut().zip(&ga).for_each(|(a, g)| *a += g);
            b.iter_mut().zip(&gb).for_each(|(b, g)| *b += g);
        }
        None => {
            grads.insert(key.clone(), (ga, gb));
        }
    }
}
