//! Expansion: the rewritten kernel function and its companion module.

mod derived;
mod launch;
mod rewrite;

use crate::parse::attr::KernelAttr;
use crate::parse::validate::validate;
use proc_macro2::{Span, TokenStream};
use quote::quote;
use syn::{parse_quote, ItemFn};

/// Entry point of `#[kernel]`.
pub fn expand(attr: TokenStream, item: TokenStream) -> TokenStream {
    let func: ItemFn = match syn::parse2(item.clone()) {
        Ok(f) => f,
        Err(_) => {
            let err = syn::Error::new(
                Span::call_site(),
                "#[kernel] goes on a function: `#[kernel(grid = ..)] fn name(x: &Tensor<f32>) { ... }`",
            )
            .to_compile_error();
            // Keep the item, so the only error is this one.
            return quote!(#err #item);
        }
    };
    let attr: KernelAttr = match syn::parse2(attr.clone()) {
        Ok(a) => a,
        Err(e) => {
            // Best guess at what was meant, so the stub has the right shape.
            let helper = attr
                .into_iter()
                .any(|t| matches!(&t, proc_macro2::TokenTree::Ident(i) if i == "helper"));
            return with_stub(e.to_compile_error(), &func, &[], helper);
        }
    };
    let tunable_names: Vec<String> = attr.tunables.iter().map(|t| t.name.to_string()).collect();
    let mut errors = validate(&func, &attr.helpers, &tunable_names, attr.helper);
    if !attr.helper && attr.grid.is_none() {
        errors.insert(
            0,
            syn::Error::new(
                func.sig.ident.span(),
                "a kernel needs a grid: `#[kernel(grid = (cdiv(out.rows(), BM), cdiv(out.cols(), BN)))]` (1 to 3 axes), \
                 or `#[kernel(helper)]` for a function kernels call",
            ),
        );
    }
    // Tunables become generic parameters of the kernel: they must not collide with its own.
    for t in &attr.tunables {
        let clash = func.sig.generics.params.iter().any(|g| match g {
            syn::GenericParam::Type(tp) => tp.ident == t.name,
            syn::GenericParam::Const(cp) => cp.ident == t.name,
            syn::GenericParam::Lifetime(_) => false,
        });
        if clash {
            errors.push(syn::Error::new(
                t.name.span(),
                format!(
                    "tunable `{}` has the name of a generic parameter of the kernel; tunables become const generics, so rename one of them",
                    t.name
                ),
            ));
        }
    }
    let space = match derived::space(&attr) {
        Ok(s) => s,
        Err(e) => {
            errors.push(e);
            Vec::new()
        }
    };
    if let Some(combined) = errors.into_iter().reduce(|mut a, b| {
        a.combine(b);
        a
    }) {
        return with_stub(
            combined.to_compile_error(),
            &func,
            &attr.tunables,
            attr.helper,
        );
    }

    let mut kernel_fn = func.clone();
    let lines = rewrite::rewrite_body(&mut kernel_fn.block, &attr.helpers, attr.helper);
    // Tunables become const generics; the context becomes the first parameter.
    for name in attr
        .tunables
        .iter()
        .map(|t| &t.name)
        .chain(attr.derived.iter().map(|(n, _)| n))
    {
        kernel_fn
            .sig
            .generics
            .params
            .push(parse_quote!(const #name: usize));
    }
    kernel_fn
        .sig
        .inputs
        .insert(0, parse_quote!(__ctx: &mut ::dsl_core::Ctx));
    kernel_fn.attrs.push(parse_quote!(#[allow(clippy::too_many_arguments, non_snake_case, unused_mut, unused_variables)]));

    if attr.helper {
        return quote!(#kernel_fn);
    }
    let module = launch::companion(&func, &attr, &space, &lines);
    quote! {
        #kernel_fn
        #module
    }
}

/// On error: the compile errors plus the function with an unreachable body (and, for a kernel, a
/// companion module whose `launch` is unreachable), so the items still exist for IDEs and callers
/// while the author fixes the reported span: one mistake gives one error, not one per caller.
fn with_stub(
    errors: TokenStream,
    func: &ItemFn,
    tunables: &[crate::parse::attr::Tunable],
    helper: bool,
) -> TokenStream {
    let mut stub = func.clone();
    stub.block = parse_quote!({ ::core::unreachable!() });
    stub.attrs
        .push(parse_quote!(#[allow(unused_variables, dead_code)]));
    let module = if helper {
        quote!()
    } else {
        launch::stub_companion(func, tunables)
    };
    quote! {
        #errors
        #stub
        #module
    }
}
