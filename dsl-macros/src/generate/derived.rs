//! Derived constants: `derived(BKH = BK / 2, BKS = BK / 32)` are evaluated by the macro for every
//! point of the tunable space (stable Rust has no arithmetic on const generics), checked to be
//! positive integers, and passed to the kernel as extra const generics.

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
    Ok(combos)
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
