//! Derived constants: `derived(BKH = BK / 2, BKS = BK / 32)` are evaluated by the macro for every
//! point of the tunable space (stable Rust has no arithmetic on const generics), checked to be
//! positive integers, and passed to the kernel as extra const generics. Constraints
//! (`constraint(BDV <= BD)`) are evaluated the same way and drop the points that fail them.

use crate::parse::attr::KernelAttr;
use syn::spanned::Spanned;
use syn::{BinOp, Expr, Lit};

/// Every point of the tunable space, each extended with the derived constants' values (tunables
/// first, in declaration order, then derived constants).
pub fn space(attr: &KernelAttr) -> syn::Result<Vec<Vec<i64>>> {
    let mut combos: Vec<Vec<i64>> = vec![Vec::new()];
    for t in &attr.tunables {
        combos = combos
            .into_iter()
            .flat_map(|c| t.values.iter().map(move |v| [c.clone(), vec![*v]].concat()))
            .collect();
    }
    let names: Vec<String> = attr
        .tunables
        .iter()
        .map(|t| t.name.to_string())
        .chain(attr.derived.iter().map(|(n, _)| n.to_string()))
        .collect();
    for combo in &mut combos {
        for (name, expr) in &attr.derived {
            let env: Vec<(&str, i64)> = names
                .iter()
                .map(String::as_str)
                .zip(combo.iter().copied())
                .collect();
            let v = eval(expr, &env).map_err(|msg| {
                let point: Vec<String> = env.iter().map(|(n, v)| format!("{n}={v}")).collect();
                syn::Error::new(
                    expr.span(),
                    format!("derived constant `{name}`: {msg} (at {})", point.join(" ")),
                )
            })?;
            if v <= 0 {
                return Err(syn::Error::new(
                    expr.span(),
                    format!("derived constant `{name}` is {v}; tile sizes must be positive"),
                ));
            }
            combo.push(v);
        }
    }
    let mut kept = Vec::with_capacity(combos.len());
    for combo in combos {
        let env: Vec<(&str, i64)> = names
            .iter()
            .map(String::as_str)
            .zip(combo.iter().copied())
            .collect();
        let mut ok = true;
        for c in &attr.constraints {
            ok &= eval_bool(c, &env)
                .map_err(|msg| syn::Error::new(c.span(), format!("constraint: {msg}")))?;
        }
        if ok {
            kept.push(combo);
        }
    }
    if kept.is_empty() {
        let span = attr
            .constraints
            .first()
            .map(|c| c.span())
            .unwrap_or_else(proc_macro2::Span::call_site);
        return Err(syn::Error::new(
            span,
            "the constraints exclude every point of the tunable space; relax them or add values",
        ));
    }
    Ok(kept)
}

/// A constraint: comparisons (`<`, `<=`, `==`, `!=`, `>=`, `>`) of integer expressions, joined by
/// `&&` and `||`.
fn eval_bool(e: &Expr, env: &[(&str, i64)]) -> Result<bool, String> {
    match e {
        Expr::Paren(p) => eval_bool(&p.expr, env),
        Expr::Binary(b) => match b.op {
            BinOp::And(_) => Ok(eval_bool(&b.left, env)? && eval_bool(&b.right, env)?),
            BinOp::Or(_) => Ok(eval_bool(&b.left, env)? || eval_bool(&b.right, env)?),
            BinOp::Lt(_) | BinOp::Le(_) | BinOp::Eq(_) | BinOp::Ne(_) | BinOp::Ge(_) | BinOp::Gt(_) => {
                let (l, r) = (eval(&b.left, env)?, eval(&b.right, env)?);
                Ok(match b.op {
                    BinOp::Lt(_) => l < r,
                    BinOp::Le(_) => l <= r,
                    BinOp::Eq(_) => l == r,
                    BinOp::Ne(_) => l != r,
                    BinOp::Ge(_) => l >= r,
                    _ => l > r,
                })
            }
            _ => Err("a constraint compares integer expressions (`A <= B`, `A * 2 >= B`), joined by `&&` or `||`".into()),
        },
        _ => Err("a constraint compares integer expressions (`A <= B`, `A * 2 >= B`), joined by `&&` or `||`".into()),
    }
}

fn eval(e: &Expr, env: &[(&str, i64)]) -> Result<i64, String> {
    match e {
        Expr::Lit(l) => match &l.lit {
            Lit::Int(i) => i.base10_parse::<i64>().map_err(|e| e.to_string()),
            _ => Err("only integer literals are allowed".into()),
        },
        Expr::Path(p) if p.path.segments.len() == 1 => {
            let n = p.path.segments[0].ident.to_string();
            env.iter()
                .find(|(k, _)| *k == n)
                .map(|(_, v)| *v)
                .ok_or_else(|| format!("`{n}` is not a tunable or an earlier derived constant"))
        }
        Expr::Paren(p) => eval(&p.expr, env),
        Expr::Binary(b) => {
            let (l, r) = (eval(&b.left, env)?, eval(&b.right, env)?);
            match b.op {
                BinOp::Add(_) => Ok(l + r),
                BinOp::Sub(_) => Ok(l - r),
                BinOp::Mul(_) => Ok(l * r),
                BinOp::Div(_) if r == 0 => Err("division by zero".into()),
                BinOp::Div(_) if l % r != 0 => Err(format!(
                    "{l} / {r} is not an integer; choose tunable values it divides"
                )),
                BinOp::Div(_) => Ok(l / r),
                _ => Err("only + - * / are allowed".into()),
            }
        }
        _ => Err("only integer arithmetic (+ - * /) over tunables and literals is allowed".into()),
    }
}
