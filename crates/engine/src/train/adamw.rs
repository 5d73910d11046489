//! The reference's optimizer: `optax.chain(clip_by_global_norm(1.0), adamw(schedule))`.
//!
//! Written out rather than taken from candle-nn, whose `AdamW` decays weights by 0.01 by default and
//! skips a parameter that got no gradient; optax updates every parameter every step (moments decay
//! and weight decay apply even to a zero gradient).

use candle_core::{Tensor, Var};

use crate::model::Result;

/// optax `adamw` defaults and the reference's clip norm.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdamWConfig {
    pub b1: f64,
    pub b2: f64,
    pub eps: f64,
    pub weight_decay: f64,
    pub max_grad_norm: f64,
}

impl Default for AdamWConfig {
    fn default() -> Self {
        Self { b1: 0.9, b2: 0.999, eps: 1e-8, weight_decay: 1e-4, max_grad_norm: 1.0 }
    }
}

/// Clipped, bias-corrected AdamW with decoupled weight decay, state for one list of parameters.
#[derive(Debug)]
pub struct AdamW {
    pub config: AdamWConfig,
    /// Updates applied so far (optax's `count`, shared by the moments and the schedule).
    pub count: usize,
    /// First and second moments, one pair per parameter in order.
    pub moments: Vec<(Tensor, Tensor)>,
}

impl AdamW {
    /// Zero moments shaped like `vars`.
    pub fn new(config: AdamWConfig, vars: &[Var]) -> Result<Self> {
        let moments = vars.iter().map(|v| Ok((v.zeros_like()?, v.zeros_like()?))).collect::<Result<_>>()?;
        Ok(Self { config, count: 0, moments })
    }

    /// `sqrt(Σ g²)` over every gradient.
    pub fn global_norm(grads: &[Tensor]) -> Result<f32> {
        let mut squares = 0f32;
        for g in grads {
            squares += g.sqr()?.sum_all()?.to_scalar::<f32>()?;
        }
        Ok(squares.sqrt())
    }

    /// One update of `vars` by `grads` (same order and shapes) at learning rate `lr`, the gradients
    /// first clipped to the configured global norm.
    pub fn step(&mut self, vars: &[Var], grads: &[Tensor], lr: f32) -> Result<()> {
        let limit = self.config.max_grad_norm as f32;
        let norm = Self::global_norm(grads)?;
        // optax: g unchanged below the limit, else g / ‖g‖ · limit.
        let clipped = match norm >= limit {
            true => grads.iter().map(|g| g * f64::from(limit / norm)).collect::<candle_core::Result<Vec<_>>>()?,
            false => grads.to_vec(),
        };
        self.update(vars, &clipped, lr)
    }

    /// One update of `vars` by gradients already clipped (a caller that clips its own way: the
    /// confidence fit, which clips each of the heads it fits at once on its own).
    pub fn update(&mut self, vars: &[Var], grads: &[Tensor], lr: f32) -> Result<()> {
        let c = self.config;
        self.count += 1;
        let step = i32::try_from(self.count).unwrap_or(i32::MAX);
        let correction1 = 1.0 - (c.b1 as f32).powi(step);
        let correction2 = 1.0 - (c.b2 as f32).powi(step);
        for ((var, grad), (mu, nu)) in vars.iter().zip(grads).zip(self.moments.iter_mut()) {
            *mu = ((grad * (1.0 - c.b1))? + (&*mu * c.b1)?)?;
            *nu = ((grad.sqr()? * (1.0 - c.b2))? + (&*nu * c.b2)?)?;
            let mu_hat = (&*mu / f64::from(correction1))?;
            let nu_hat = (&*nu / f64::from(correction2))?;
            let adam = (mu_hat / (nu_hat.sqrt()? + c.eps)?)?;
            let update = (adam + (var.as_tensor() * c.weight_decay)?)?;
            var.set(&(var.as_tensor() - (update * f64::from(lr))?)?)?;
        }
        Ok(())
    }
}
