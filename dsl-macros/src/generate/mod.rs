//! Expansion: the rewritten kernel function and its companion module.

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
            return syn::Error::new(
                Span::call_site(),
                "#[kernel] goes on a function: `#[kernel] fn name(x: &Tensor<f32>) { ... }`",
            )
            .to_compile_error()
        }
    };
    let attr: KernelAttr = match syn::parse2(attr) {
        Ok(a) => a,
        Err(e) => return with_stub(e.to_compile_error(), &func),
    };
    let tunable_names: Vec<String> = attr.tunables.iter().map(|t| t.name.to_string()).collect();
    let errors = validate(&func, &attr.helpers, &tunable_names, attr.helper);
    if let Some(combined) = errors.into_iter().reduce(|mut a, b| {
        a.combine(b);
        a
    }) {
        return with_stub(combined.to_compile_error(), &func);
    }
    if !attr.helper && attr.grid.is_none() {
        let e = syn::Error::new(
            func.sig.ident.span(),
            "a kernel needs a grid: `#[kernel(grid = (cdiv(out.rows(), BM), cdiv(out.cols(), BN)))]` (1 to 3 axes)",
        );
        return with_stub(e.to_compile_error(), &func);
    }

    let mut kernel_fn = func.clone();
    let lines = rewrite::rewrite_body(&mut kernel_fn.block, &attr.helpers);
    // Tunables become const generics; the context becomes the first parameter.
    for t in &attr.tunables {
        let name = &t.name;
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
    let module = launch::companion(&func, &attr, &lines);
    quote! {
        #kernel_fn
        #module
    }
}

/// On error: the compile errors plus the function with an unreachable body, so the item still
/// exists for IDEs and callers while the author fixes the reported span.
fn with_stub(errors: TokenStream, func: &ItemFn) -> TokenStream {
    let mut stub = func.clone();
    stub.block = parse_quote!({ ::core::unreachable!() });
    stub.attrs
        .push(parse_quote!(#[allow(unused_variables, dead_code)]));
    quote! {
        #errors
        #stub
    }
}
